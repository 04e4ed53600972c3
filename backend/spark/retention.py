"""Bounded disk for a job that runs for months (DESIGN.md §6): spool trimmed behind Spark's commits,
answer table compacted, checkpoint history bounded.

- Spool: Spark runs batch ``b`` only after committing ``b - 1``, and a restart replays at most the
  batches after the last committed one, from that batch's end offset; the state store holds the
  rest (the ``Host`` snapshot and journal). So while the sink delivers batch ``b`` every spool
  segment wholly below the end offset of the last committed batch can go (``Spool.trim`` keeps the
  active segment).
- Answer table: ``answers.Table.compact`` up to the batch just delivered (level merging).
- Checkpoint: Spark deletes offset and commit log entries and state-store versions older than
  ``spark.sql.streaming.minBatchesToRetain`` (``job.session(retain_batches=...)``); ``status.json``
  and ``sink.committed`` are replaced in place.
"""
import json
import os


def committed_offset(checkpoint):
    """One past the last spool offset of Spark's last committed batch in ``checkpoint``; None if
    nothing was committed yet."""
    try:
        ids = sorted((int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()), reverse=True)
    except FileNotFoundError:
        return None
    for b in ids:
        try:
            with open(os.path.join(checkpoint, "offsets", str(b))) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        if len(lines) < 3:
            raise ValueError("offset log %s/offsets/%d has no source offset" % (checkpoint, b))
        return json.loads(lines[2])["offset"]
    return None


class Retention:
    """Called by the sink after it delivered a batch: compact answers, trim the spool writer ``spool``;
    ``stats`` (files merged so far, the spool's earliest offset) go to ``status.json``."""

    def __init__(self, checkpoint, table, spool=None):
        self.checkpoint = checkpoint
        self.table = table
        self.spool = spool
        self.stats = {"merged": 0, "trimmed_to": None}

    def __call__(self, batch_id):
        self.stats["merged"] += self.table.compact(batch_id)
        if self.spool is not None:
            end = committed_offset(self.checkpoint)
            if end is not None:
                self.stats["trimmed_to"] = self.spool.trim(end)
