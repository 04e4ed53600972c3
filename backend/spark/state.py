"""The Spark job's durable group state (DESIGN.md §6): a snapshot of the ``Host`` plus a journal of records.

The ``Host`` is deterministic in its records, so its durable form need not be rewritten every
micro-batch. Per group key the state store holds

- ``snap``: the pickled ``Host`` as of the last snapshot, in ``CHUNK``-sized rows (``ListState``);
- ``journal``: every record applied since that snapshot, appended per batch as pickled
  ``(token, records)`` rows of up to ``JOURNAL_ROW`` records (``ListState.appendList``, a RocksDB
  merge: the cost follows the batch), ``token`` the batch's (a snapshot starts it with an empty row);
- ``meta``: ``(token, journal records, journal first arrival)``, ``token`` naming the exact Host
  state the store describes (a fresh random token per batch).

The live ``Host`` stays in the Python worker between batches (``_CACHE``, keyed by group) together
with the token it matches. A batch uses the cached Host if its token equals the stored one. If the
cached Host is older (another worker ran the group's last batches: Spark gives a key no worker
affinity), and its token is in the journal, it catches up by replaying the journal rows after that
token's, only the records it missed. Otherwise (a restart, a snapshot since, a batch replayed after a
crash, whose store is the previous version) it rebuilds: unpickle the snapshot and replay the whole
journal, which yields the same Host the uninterrupted run had. The cache entry is taken out while a
batch runs, so a batch that fails half way never leaves a half-applied Host behind. A new snapshot is written (and the journal cleared)
once the journal holds ``snapshot_records`` records, and at least one per source, or spans
``snapshot_seconds`` of arrival time and holds one record per 8 sources: a snapshot costs the
fleet's size, so its cadence follows the fleet and its cost per record stays constant, while every
other batch costs only its own records (a journal append).
"""
import gc
import os
import pickle

from backend import host as hostmod

# ListState travels as Arrow, while a single large ValueState update (hundreds of KB for thousands
# of sources) reached the JVM state server corrupted ("invalid pickle opcode") in PySpark 4.0.1.
CHUNK = 256 * 1024
SNAP_SCHEMA = "host binary"
JOURNAL_SCHEMA = "records binary"
JOURNAL_ROW = 2000      # records per journal row (a pickled list; Arrow would type an all-null column as null)
META_SCHEMA = "token string, journal long, since double"
SNAPSHOT_RECORDS = 200000
SNAPSHOT_SECONDS = 600.0

_CACHE = {}     # group key -> (token, Host): the live Host of a group this worker ran last


class GroupState:
    """One group's snapshot, journal and meta state variables (from a ``StatefulProcessorHandle``)."""

    def __init__(self, handle, settings, snapshot_records=SNAPSHOT_RECORDS, snapshot_seconds=SNAPSHOT_SECONDS):
        self.snap = handle.getListState("snap", SNAP_SCHEMA)
        self.journal = handle.getListState("journal", JOURNAL_SCHEMA)
        self.meta = handle.getValueState("meta", META_SCHEMA)
        self.settings = settings
        self.snapshot_records = snapshot_records
        self.snapshot_seconds = snapshot_seconds
        self.snapshot_bytes = None          # size of the snapshot the last ``store`` wrote (None: none)

    def load(self, key):
        """``(Host, (journal records, first arrival), rebuilt)``: the group's Host as the store describes
        it; ``rebuilt``: False (cached), ``"caught up"`` (a cached Host replayed the records it missed)
        or True (unpickled from the snapshot)."""
        meta = self.meta.get() if self.meta.exists() else None
        cached = _CACHE.pop(key, None)
        if meta is None:
            return hostmod.Host(self.settings), (0, None), False
        journal = (meta[1], meta[2] if meta[1] else None)
        if cached is not None and cached[0] == meta[0]:
            return cached[1], journal, False
        rows = [pickle.loads(r[0]) for r in self.journal.get()] if self.journal.exists() else []
        if cached is not None:          # left behind by another worker: replay what came after its batch
            mark = [i for i, (token, _) in enumerate(rows) if token == cached[0]]
            if mark:
                return _replay(cached[1], rows[mark[-1] + 1:]), journal, "caught up"
        h = pickle.loads(b"".join(r[0] for r in self.snap.get())) if self.snap.exists() \
            else hostmod.Host(self.settings)
        return _replay(h, rows), journal, True

    def store(self, key, h, records, journal):
        """Persist a batch's ``records`` (already applied to ``h``) and cache ``h``."""
        count, since = journal
        if records and since is None:
            since = records[0][0]
        count += len(records)
        n = len(h.coord.cache.sources)
        self.snapshot_bytes = None
        token = os.urandom(12).hex()
        if count >= max(self.snapshot_records, n) or (
                records and max(r[0] for r in records) - since >= self.snapshot_seconds and 8 * count >= n):
            blob = pickle.dumps(h, protocol=pickle.HIGHEST_PROTOCOL)
            self.snap.put([(blob[i:i + CHUNK],) for i in range(0, len(blob), CHUNK)])
            self.journal.clear()
            count, since = 0, None
            self.snapshot_bytes = len(blob)
            records = []                    # the journal restarts with the snapshot's token
        self.journal.appendList([(pickle.dumps((token, records[i:i + JOURNAL_ROW]), protocol=pickle.HIGHEST_PROTOCOL),)
                                 for i in range(0, max(1, len(records)), JOURNAL_ROW)])
        self.meta.update((token, count, float(since) if count else 0.0))
        _CACHE[key] = (token, h)
        _HELD[0] += n - _SIZES.get(key, 0)
        _SIZES[key] = n
        _freeze(_HELD[0])

    def drop(self, key):
        """Forget the group (merged into another, ``backend.spark.groups``)."""
        self.snap.clear()
        self.journal.clear()
        self.meta.clear()
        _CACHE.pop(key, None)
        _HELD[0] -= _SIZES.pop(key, 0)
        self.snapshot_bytes = None


def _replay(h, rows):
    """``h`` after the records of journal ``rows`` ``(token, records)``."""
    for _, records in rows:
        for arrival, device, channel, payload, retained in records:
            h.record(arrival, device, channel, payload, retained)
    return h


_FROZEN = [0]   # sources held when the worker's heap was last frozen
_SIZES = {}     # group key -> sources of its Host when last stored in this worker
_HELD = [0]     # their sum: the sources the worker's cached Hosts hold (every group's, keyed by group)


def _freeze(n):
    """Move the long-lived heap (the cached Hosts) out of the cyclic garbage collector's sight once
    the sources held (``n``, over every group) have doubled since the last time: a full collection
    would otherwise walk every source's objects, a pause that grows with the fleet. Frozen objects
    are still freed by reference counting."""
    if n > 2 * _FROZEN[0]:
        gc.collect()
        gc.freeze()
        _FROZEN[0] = n


def forget():
    """Drop every cached Host (as a new worker process would start): the next batches rebuild."""
    _CACHE.clear()
    _SIZES.clear()
    _HELD[0] = 0
