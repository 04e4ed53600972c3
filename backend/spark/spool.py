"""Durable, append-only, offset-addressed spool between the MQTT bridge and Spark (DESIGN.md §6 Ingest).

Layout of a spool directory::

    00000000000000000000.seg   segment files, named by the offset of their first record
    committed                  decimal offset one past the last record readers may see
    lock                       held (flock) by the one writer

A record is ``<u32 body length><u32 crc32(body)>`` followed by the body
``<u64 offset><f64 arrival><u16 topic length> topic payload``. Offsets are dense (0, 1, 2, ...)
and never reused. A writer (``Spool(path)``) appends, fsyncs according to its policy and then
replaces ``committed`` atomically (write, fsync, rename); a reader (``Spool(path, readonly=True)``)
never looks past ``committed``, so it sees only whole records. Reopening a writer after a crash
walks the last segment and truncates a torn tail (short header, bad length, short body, CRC or
offset mismatch). With ``fsync="always"`` nothing appended is lost even on power loss; with
``"never"`` or an interval, a process kill loses nothing (the page cache survives) but a machine
crash may lose the unsynced tail, whose offsets are then reissued.
"""
import collections
import errno
import fcntl
import mmap
import os
import struct
import time
import zlib

Record = collections.namedtuple("Record", "offset arrival topic payload")

MAX_RECORD = 1 << 20        # largest body accepted; anything longer on disk is a torn tail
SEGMENT_BYTES = 64 << 20    # default size at which a new segment is started
_HEAD = struct.Struct("<II")
_BODY = struct.Struct("<QdH")
_OFFSET = struct.Struct("<Q")
_STRIDE = 1024              # a reader remembers the position of every _STRIDE-th record
_POSITIONS = {}             # segment path -> positions of records 0, _STRIDE, 2*_STRIDE, ...


class SpoolError(Exception):
    """The spool cannot do what was asked (missing, locked, trimmed range, corrupt sealed data)."""


def _segment_name(base):
    return "%020d.seg" % base


def _parse(buf, pos, size, expect):
    """Return ``(end, record)`` of the whole, valid record at ``pos``, or None if there is none."""
    if pos + _HEAD.size > size:
        return None
    length, crc = _HEAD.unpack_from(buf, pos)
    end = pos + _HEAD.size + length
    if length < _BODY.size or length > MAX_RECORD or end > size:
        return None
    body = buf[pos + _HEAD.size:end]
    if zlib.crc32(body) != crc:
        return None
    offset, arrival, tlen = _BODY.unpack_from(body, 0)
    if offset != expect or _BODY.size + tlen > length:
        return None
    topic = body[_BODY.size:_BODY.size + tlen]
    try:
        topic = topic.decode()
    except UnicodeDecodeError:
        return None
    return end, Record(offset, arrival, topic, body[_BODY.size + tlen:])


def _encode(offset, arrival, topic, payload):
    raw_topic = topic.encode()
    body = _BODY.pack(offset, float(arrival), len(raw_topic)) + raw_topic + bytes(payload)
    if len(raw_topic) > 0xFFFF or len(body) > MAX_RECORD:
        raise ValueError("record at offset %d is larger than %d bytes" % (offset, MAX_RECORD))
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """One spool directory, opened as its single writer or as one of any number of readers.

    ``fsync`` is ``"always"`` (fsync every ``append`` before it returns), ``"never"`` (leave it to
    the OS; ``sync()`` forces it) or a number of seconds (fsync when that long has passed since the
    last one).
    """

    def __init__(self, path, readonly=False, fsync="always", segment_bytes=SEGMENT_BYTES):
        if fsync not in ("always", "never") and not (isinstance(fsync, (int, float)) and fsync >= 0):
            raise ValueError("fsync must be 'always', 'never' or seconds >= 0, got %r" % (fsync,))
        self.path = path
        self.readonly = readonly
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._lock = None
        self._file = None
        if readonly:
            if not os.path.isdir(path):
                raise SpoolError("no spool at %s" % path)
            return
        os.makedirs(path, exist_ok=True)
        self._lock = open(os.path.join(path, "lock"), "a+b")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self._lock.close()
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise SpoolError("spool %s already has a writer" % path)
            raise
        self.recovered = self._recover()
        self._synced_at = time.monotonic()

    # -- writer -------------------------------------------------------------------------------
    def _recover(self):
        """Truncate a torn tail of the last segment; return the number of bytes cut off."""
        bases = self._bases()
        if not bases:
            bases = [self._read_committed()]
        base = bases[-1]
        seg = os.path.join(self.path, _segment_name(base))
        with open(seg, "ab+") as f:
            f.seek(0)
            data = f.read()
        pos, offset = 0, base
        while True:
            step = _parse(data, pos, len(data), offset)
            if step is None:
                break
            pos, offset = step[0], offset + 1
        cut = len(data) - pos
        self._file = open(seg, "r+b", buffering=0)
        self._file.truncate(pos)
        self._file.seek(pos)
        os.fsync(self._file.fileno())
        _fsync_dir(self.path)
        self._base, self._size, self._next = base, pos, offset
        if self._read_committed() != offset:
            self._write_committed(offset, durable=True)
        return cut

    def append(self, records):
        """Append ``(arrival, topic, payload)`` records; return their offsets (a range).

        All records are validated first (ValueError appends none). If a write fails (OSError),
        the unfinished part is cut off again; records written before a segment roll stay.
        """
        self._writable()
        first = self._next
        encoded = [_encode(first + i, a, t, p) for i, (a, t, p) in enumerate(records)]
        chunk, size = [], 0
        for data in encoded:
            if self._size + size > 0 and self._size + size + len(data) > self.segment_bytes:
                self._write(chunk)
                chunk, size = [], 0
                self._roll()
            chunk.append(data)
            size += len(data)
        self._write(chunk)
        if self._next == first:
            return range(first, first)
        due = self.fsync == "always" or (
            self.fsync != "never" and time.monotonic() - self._synced_at >= self.fsync)
        if due:
            os.fsync(self._file.fileno())
            self._synced_at = time.monotonic()
        self._write_committed(self._next, durable=due)
        return range(first, self._next)

    def sync(self):
        """Force everything appended so far (and ``committed``) to disk."""
        self._writable()
        os.fsync(self._file.fileno())
        self._write_committed(self._next, durable=True)
        self._synced_at = time.monotonic()

    def trim(self, below):
        """Delete whole segments holding only offsets < ``below`` (never the active one).

        Returns the new earliest offset.
        """
        self._writable()
        bases = self._bases()
        for base, nxt in zip(bases, bases[1:]):
            if nxt > below or base == self._base:
                break
            os.remove(os.path.join(self.path, _segment_name(base)))
            _POSITIONS.pop(os.path.join(self.path, _segment_name(base)), None)
        _fsync_dir(self.path)
        return self.earliest_offset()

    def close(self):
        if self._file is not None:
            if self.fsync != "never":
                self.sync()
            self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _writable(self):
        if self.readonly or self._file is None:
            raise SpoolError("spool %s is not open for writing" % self.path)

    def _write(self, chunk):
        blob = memoryview(b"".join(chunk))
        done = 0
        try:
            while done < len(blob):
                done += self._file.write(blob[done:])
        except OSError:
            self._file.truncate(self._size)
            self._file.seek(self._size)
            raise
        self._size += done
        self._next += len(chunk)

    def _roll(self):
        if self.fsync != "never":
            os.fsync(self._file.fileno())
        self._file.close()
        self._base, self._size = self._next, 0
        self._file = open(os.path.join(self.path, _segment_name(self._base)), "xb", buffering=0)
        _fsync_dir(self.path)

    def _write_committed(self, offset, durable):
        tmp = os.path.join(self.path, "committed.tmp")
        with open(tmp, "wb") as f:
            f.write(b"%d\n" % offset)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, "committed"))
        if durable:
            _fsync_dir(self.path)

    # -- both -----------------------------------------------------------------------------------
    def _bases(self):
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            raise SpoolError("no spool at %s" % self.path)
        return sorted(int(n[:-4]) for n in names if n.endswith(".seg") and n[:-4].isdigit())

    def _read_committed(self):
        try:
            with open(os.path.join(self.path, "committed"), "rb") as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            raise SpoolError("corrupt committed-offset file in %s" % self.path)

    def latest_offset(self):
        """One past the last record readers may see (the next offset ``append`` will assign)."""
        if not self.readonly:
            return self._next
        return self._read_committed()

    def earliest_offset(self):
        """The smallest offset still stored (== ``latest_offset()`` when the spool is empty)."""
        bases = self._bases()
        return bases[0] if bases else self.latest_offset()

    def read(self, start, end):
        """Records with ``start <= offset < end`` (``end`` is capped at ``latest_offset()``)."""
        return list(self.scan(start, end))

    def scan(self, start, end):
        """Iterate the records of ``read(start, end)`` without holding them all in memory."""
        end = min(end, self.latest_offset())
        if start >= end:
            return
        bases = self._bases()
        if not bases or start < bases[0]:
            raise SpoolError("offsets from %d were trimmed (earliest is %s)"
                             % (start, bases[0] if bases else "none"))
        for i, base in enumerate(bases):
            nxt = bases[i + 1] if i + 1 < len(bases) else end
            if nxt <= start:
                continue
            if base >= end:
                break
            yield from self._scan_segment(base, max(start, base), min(end, nxt))

    def _scan_segment(self, base, start, end):
        seg = os.path.join(self.path, _segment_name(base))
        try:
            f = open(seg, "rb")
        except FileNotFoundError:
            raise SpoolError("segment %s was trimmed while being read" % seg)
        with f:
            size = os.fstat(f.fileno()).st_size
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            yield from self._walk(seg, data, size, base, start, end)
        finally:
            if size:
                data.close()

    @staticmethod
    def _walk(seg, data, size, base, start, end):
        marks = _POSITIONS.setdefault(seg, [0])
        k = min((start - base) // _STRIDE, len(marks) - 1)
        pos, offset = marks[k], base + k * _STRIDE
        if k and (pos + _HEAD.size + 8 > size or _OFFSET.unpack_from(data, pos + _HEAD.size)[0] != offset):
            del marks[1:]   # a stale position (the spool was replaced): walk from the start
            pos, offset = 0, base
        while offset < end:
            if offset < start:
                if pos + _HEAD.size > size:
                    break
                pos += _HEAD.size + _HEAD.unpack_from(data, pos)[0]
            else:
                step = _parse(data, pos, size, offset)
                if step is None:
                    break
                pos = step[0]
                yield step[1]
            offset += 1
            if (offset - base) % _STRIDE == 0 and (offset - base) // _STRIDE == len(marks):
                marks.append(pos)
        if offset < end:
            _POSITIONS.pop(seg, None)
            raise SpoolError("corrupt or missing record %d in %s at byte %d" % (offset, seg, pos))
