"""The Spark job's answer table (DESIGN.md §6): Parquet files merged in levels, so a job running for
months keeps a bounded number of files and readers still see every answer change.

Layout of ``<dir>/answers``::

    <first>-<last>-L<level>.parquet    the answers of batches first..last (12-digit batch ids)

A batch with answers writes ``<b>-<b>-L0`` (atomically: a replay of the batch overwrites it with the
same rows). ``compact(upto)`` merges the oldest ``fan`` files of a level, all of batches ``<= upto``
(delivered in full, so never written again), into one file of the next level; the level's files
are a contiguous run, so the merged range holds exactly their batches. With ``fan`` files at most
per level, ``n`` batches leave at most ``fan · (1 + log_fan n)`` files, and each row is rewritten
once per level. A file whose batch range lies inside another's was merged already (a crash between
writing the merged file and deleting its inputs): readers skip it and the next ``compact`` deletes it.
"""
import json
import os
import re

FAN = 16
READ_TRIES = 8          # listings a reader tries while a concurrent compact merges files under it
_NAME = re.compile(r"^(\d{12})-(\d{12})-L(\d+)\.parquet$")


def _name(first, last, level):
    return "%012d-%012d-L%d.parquet" % (first, last, level)


class Table:
    """The answer table in ``directory`` (created if missing)."""

    def __init__(self, directory, fan=FAN):
        if fan < 2:
            raise ValueError("an answer table merges at least 2 files at a time, got fan=%r" % (fan,))
        self.dir = directory
        self.fan = fan
        os.makedirs(directory, exist_ok=True)

    def files(self):
        """``(first, last, level, name)`` of the live files in batch order (covered ones left out)."""
        found = []
        for n in os.listdir(self.dir):
            m = _NAME.match(n)
            if m:
                found.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), n))
        found.sort(key=lambda f: (f[0], -f[1]))
        live = []
        for f in found:
            if live and f[1] <= live[-1][1]:
                continue            # inside the range of a merged file
            live.append(f)
        return live

    def write(self, batch_id, table):
        """The answer rows of one batch (a pyarrow table with a ``batch`` column) as its own file."""
        import pyarrow.parquet as pq
        path = os.path.join(self.dir, _name(batch_id, batch_id, 0))
        pq.write_table(table, path + ".tmp")
        os.replace(path + ".tmp", path)

    def compact(self, upto):
        """Merge files of batches ``<= upto`` level by level; delete what a merged file covers.
        Returns the number of files merged."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        live = self.files()
        keep = {f[3] for f in live}
        for n in os.listdir(self.dir):
            if _NAME.match(n) and n not in keep:
                os.remove(os.path.join(self.dir, n))
        merged = 0
        while True:
            for level in sorted({f[2] for f in live}):
                run = [f for f in live if f[2] == level and f[1] <= upto][:self.fan]
                if len(run) == self.fan:
                    break
            else:
                return merged
            out = os.path.join(self.dir, _name(run[0][0], run[-1][1], level + 1))
            pq.write_table(pa.concat_tables([pq.read_table(os.path.join(self.dir, f[3])) for f in run]), out + ".tmp")
            os.replace(out + ".tmp", out)
            for f in run:
                os.remove(os.path.join(self.dir, f[3]))
            merged += len(run)
            live = self.files()

    def read(self, upto=None, columns=("fields",)):
        """The rows of batches ``<= upto`` in (batch, seq) order, as a pyarrow table of ``columns``. A reader
        beside the running job may list a file that ``compact`` then merges away: it lists again (the merged
        file holds the same rows)."""
        for _ in range(READ_TRIES - 1):
            try:
                return self._read(upto, columns)
            except FileNotFoundError:
                continue
        return self._read(upto, columns)

    def _read(self, upto, columns):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        cols = list(dict.fromkeys(("batch", "seq") + tuple(columns)))
        parts = []
        for first, last, _, name in self.files():
            if upto is not None and first > upto:
                break
            t = pq.read_table(os.path.join(self.dir, name), columns=cols)
            if upto is not None and last > upto:
                t = t.filter(pc.less_equal(t.column("batch"), upto))
            parts.append(t)
        if not parts:
            return None
        return pa.concat_tables(parts).sort_by([("batch", "ascending"), ("seq", "ascending")]).select(list(columns))


def read_answers(out_dir, upto=None):
    """The answer table of a job's ``out_dir`` in (batch, seq) order as a list of answer dicts
    (batches ``<= upto``)."""
    d = os.path.join(out_dir, "answers")
    if not os.path.isdir(d):
        return []
    t = Table(d).read(upto)
    return [] if t is None else [json.loads(x) for x in t.column("fields").to_pylist()]
