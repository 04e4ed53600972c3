"""The Spark job's durable group state (DESIGN.md §6): a snapshot of the ``Host`` plus a journal of records.

The ``Host`` is deterministic in its records, so its durable form need not be rewritten every
micro-batch. Per group key the state store holds

- ``snap0``/``snap1``: the pickled ``Host`` as of the installed snapshot (slot ``meta.slot``), in
  ``CHUNK``-sized rows (``ListState``); the other slot receives the next snapshot;
- ``j0``, ``j1``, ``j2``: journals of ``(token, records)`` rows, one or more per batch (up to
  ``JOURNAL_ROW`` pickled records each, ``ListState.appendList``, a RocksDB merge: the cost follows
  the batch), ``token`` the batch's. Each snapshot taken starts the next journal (``meta.cur``); the
  one before the installed snapshot's is cleared then, so the journals hold every row after the
  installed snapshot and the rows before it back to the snapshot before;
- ``meta``: the ``token`` naming the exact Host state the store describes (a fresh random token per
  batch), the records since the last snapshot taken and their first arrival, the installed
  snapshot's token ``base``, the snapshot being taken or installed ``fork`` and its bytes installed.

**Snapshots in the background.** A snapshot costs the fleet's size (pickling a 1,000,000-source Host
takes about 20 s, storing it some 13 s more), so no batch pays it: the batch that decides to take one
``fork()``s the Python worker, and the child, a copy-on-write image of the Host as of that batch,
pickles it to a file in ``directory`` (the job's ``<dir>/snapshots``, at low priority) while the worker
goes on. The batches that follow copy the file
into the free slot, at most ``INSTALL`` bytes each, and the last one switches slots. A snapshot lost
half way (its worker died, or it was taken on another machine) is abandoned when the next is due.

The live ``Host`` stays in the Python worker between batches (``_CACHE``, keyed by group) together
with the token it matches. A batch uses the cached Host if its token equals the stored one. If the
cached Host is older (another worker ran the group's last batches: Spark gives a key no worker
affinity) and its token is in the journals, it catches up by replaying the rows after it, only the
records it missed, across a snapshot too. Otherwise (a restart, a batch replayed after a crash, whose
store is the previous version) it rebuilds: unpickle the installed snapshot and replay the rows after
it, which yields the same Host the uninterrupted run had. The cache entry is taken out while a batch
runs, so a batch that fails half way never leaves a half-applied Host behind. A snapshot is taken once
``snapshot_records`` records, and at least one per source, came since the last, or they span
``snapshot_seconds`` of arrival time and number one per 8 sources: a snapshot costs the fleet's size,
so its cadence follows the fleet and its cost per record stays constant.
"""
import gc
import hashlib
import os
import pickle

from backend import host as hostmod

# ListState travels as Arrow, while a single large ValueState update (hundreds of KB for thousands
# of sources) reached the JVM state server corrupted ("invalid pickle opcode") in PySpark 4.0.1.
CHUNK = 256 * 1024
INSTALL = 16 * CHUNK    # snapshot bytes a batch copies into the store
SNAP_SCHEMA = "host binary"
JOURNAL_SCHEMA = "token string, records binary"
JOURNAL_ROW = 2000      # records per journal row (a pickled list; Arrow would type an all-null column as null)
META_SCHEMA = ("token string, count long, since double, base string, fork string, cur int, slot int, "
               "done long")
SNAPSHOT_RECORDS = 200000
SNAPSHOT_SECONDS = 600.0

# the meta row's fields: the batch token the store describes, journal records since the last snapshot
# taken and their first arrival, the installed snapshot's token (BASE, "" for none), the snapshot being
# taken or installed (FORK), the journal appended to (CUR), the installed slot, the bytes installed
TOKEN, COUNT, SINCE, BASE, FORK, CUR, SLOT, DONE = range(8)

_CACHE = {}     # group key -> (token, Host): the live Host of a group this worker ran last
_CHILDREN = {}  # token -> pid of this worker's child still pickling that batch's Host


class GroupState:
    """One group's snapshots, journals and meta state variables (from a ``StatefulProcessorHandle``)."""

    def __init__(self, handle, settings, directory, snapshot_records=SNAPSHOT_RECORDS, snapshot_seconds=SNAPSHOT_SECONDS):
        self.snaps = [handle.getListState("snap%d" % i, SNAP_SCHEMA) for i in range(2)]
        self.journals = [handle.getListState("j%d" % i, JOURNAL_SCHEMA) for i in range(3)]
        self.meta = handle.getValueState("meta", META_SCHEMA)
        self.settings = settings
        self.snapshot_records = snapshot_records
        self.snapshot_seconds = snapshot_seconds
        self.snapshot_bytes = None          # size of the snapshot the last ``store`` installed (None: none)
        self.directory = directory          # where the snapshot children write (every worker reads it)

    def load(self, key):
        """``(Host, meta, rebuilt)``: the group's Host as the store describes it; ``rebuilt``: False
        (cached), ``"caught up"`` (a cached Host replayed the records it missed) or True (unpickled
        from the snapshot, or new)."""
        m = list(self.meta.get()) if self.meta.exists() else None
        cached = _CACHE.pop(key, None)
        if m is None:
            return hostmod.Host(self.settings), ["", 0, 0.0, "", "", 0, 0, 0], False
        if cached is not None and cached[0] == m[TOKEN]:
            return cached[1], m, False
        rows = [r for i in (1, 2, 3) if self.journals[(m[CUR] + i) % 3].exists()
                for r in self.journals[(m[CUR] + i) % 3].get()]       # oldest journal first
        if cached is not None:          # left behind by another worker: replay what came after its batch
            after = _after(rows, cached[0])
            if after is not None:
                return _replay(cached[1], after), m, "caught up"
        snap = self.snaps[m[SLOT]]
        h = pickle.loads(b"".join(r[0] for r in snap.get())) if m[BASE] and snap.exists() \
            else hostmod.Host(self.settings)
        return _replay(h, _after(rows, m[BASE]) if m[BASE] else rows), m, True

    def store(self, key, h, records, m):
        """Persist a batch's ``records`` (already applied to ``h``), go on with a snapshot, and cache ``h``."""
        token = os.urandom(12).hex()
        self.journals[m[CUR]].appendList([(token, pickle.dumps(records[i:i + JOURNAL_ROW], protocol=pickle.HIGHEST_PROTOCOL))
                                        for i in range(0, max(1, len(records)), JOURNAL_ROW)])
        if records and not m[COUNT]:
            m[SINCE] = float(records[0][0])
        m[TOKEN], m[COUNT] = token, m[COUNT] + len(records)
        self.snapshot_bytes = None
        _reap()
        n = len(h.coord.cache.sources)
        due = m[COUNT] >= max(self.snapshot_records, n) or (
            records and max(r[0] for r in records) - m[SINCE] >= self.snapshot_seconds and 8 * m[COUNT] >= n)
        if (m[FORK] == m[BASE] or not self._install(key, m, due)) and due:
            _fork(h, self._path(key, token))
            if m[BASE] == m[FORK]:      # the last snapshot taken is installed: start the next journal
                m[CUR] = (m[CUR] + 1) % 3
                self.journals[m[CUR]].clear()
            m[COUNT], m[SINCE], m[FORK], m[DONE] = 0, 0.0, token, 0
        self.meta.update(tuple(m))
        _CACHE[key] = (token, h)
        _HELD[0] += n - _SIZES.get(key, 0)
        _SIZES[key] = n
        _freeze(_HELD[0])

    def _install(self, key, m, due):
        """Copy up to ``INSTALL`` more bytes of snapshot ``m[FORK]`` into the free slot, switching slots
        once it is all in; False when it is abandoned: its file is not here nor being written here (its
        worker died, or is on another machine) and a new snapshot is due."""
        path = self._path(key, m[FORK])
        if not os.path.exists(path):
            return not due or m[FORK] in _CHILDREN or os.path.exists(path + ".tmp")
        size = os.path.getsize(path)
        free = self.snaps[1 - m[SLOT]]
        if m[DONE] == 0:
            free.clear()
        with open(path, "rb") as f:
            f.seek(m[DONE])
            data = f.read(min(INSTALL, size - m[DONE]))
        free.appendList([(data[i:i + CHUNK],) for i in range(0, len(data), CHUNK)])
        m[DONE] += len(data)
        if m[DONE] >= size:
            self.snaps[m[SLOT]].clear()
            m[BASE], m[SLOT], m[DONE] = m[FORK], 1 - m[SLOT], 0
            self.snapshot_bytes = size
            folder = os.path.dirname(path)
            for name in os.listdir(folder):     # this one, and any a batch replayed after a crash took
                os.remove(os.path.join(folder, name))
        return True

    def _path(self, key, token):
        """The file of group ``key``'s snapshot taken at batch ``token``: a folder per group."""
        return os.path.join(self.directory, hashlib.sha1(key.encode()).hexdigest()[:16], token + ".pkl")

    def drop(self, key):
        """Forget the group (merged into another, ``backend.spark.groups``)."""
        for s in self.snaps + self.journals:
            s.clear()
        self.meta.clear()
        _CACHE.pop(key, None)
        _HELD[0] -= _SIZES.pop(key, 0)
        self.snapshot_bytes = None


def _after(rows, token):
    """The journal rows after the one of batch ``token`` (None: not there)."""
    mark = [i for i, r in enumerate(rows) if r[0] == token]
    return rows[mark[-1] + 1:] if mark else None


def _replay(h, rows):
    """``h`` after the records of journal ``rows`` ``(token, pickled records)``."""
    for _, blob in rows:
        for arrival, device, channel, payload, retained in pickle.loads(blob):
            h.record(arrival, device, channel, payload, retained)
    return h


def _fork(h, path):
    """Pickle ``h`` to ``path`` in a child process (a copy-on-write image of it as of now)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pid = os.fork()
    if pid == 0:                        # the child: pickle at low priority, never return to Spark's code
        code = 1
        try:
            os.nice(10)
            with open(path + ".tmp", "wb") as f:
                pickle.dump(h, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(path + ".tmp", path)
            code = 0
        finally:
            os._exit(code)
    _CHILDREN[os.path.basename(path)[:-4]] = pid


def _reap():
    """Collect this worker's children that have finished."""
    for token, pid in list(_CHILDREN.items()):
        try:
            if not os.waitpid(pid, os.WNOHANG)[0]:
                continue
        except ChildProcessError:
            pass
        del _CHILDREN[token]


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
