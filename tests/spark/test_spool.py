"""Spool: offsets, durability across reopen, torn tails, segments and trimming, against a list oracle."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings, HealthCheck, strategies as st

from backend.spark.spool import Spool, SpoolError, Record, MAX_RECORD
from edge.core import topics

TOPIC = topics.device("f1", "dev1", "up")


def recs(n, start=0):
    return [(float(start + i), TOPIC, b"p%d" % (start + i)) for i in range(n)]


def segments(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".seg"))


def test_append_returns_dense_offsets_and_read_is_half_open(tmp_path):
    with Spool(tmp_path) as s:
        assert s.latest_offset() == 0 and s.read(0, 10) == []
        assert list(s.append(recs(3))) == [0, 1, 2]
        assert list(s.append([])) == []
        assert list(s.append(recs(2, 3))) == [3, 4]
        assert s.read(1, 3) == [Record(1, 1.0, TOPIC, b"p1"), Record(2, 2.0, TOPIC, b"p2")]
        assert [r.offset for r in s.read(0, 99)] == [0, 1, 2, 3, 4]
        assert s.read(4, 4) == [] and s.latest_offset() == 5


def test_reopen_keeps_records_and_continues_offsets(tmp_path):
    with Spool(tmp_path) as s:
        s.append(recs(4))
    with Spool(tmp_path) as s:
        assert s.recovered == 0 and s.latest_offset() == 4
        assert list(s.append(recs(1, 4))) == [4]
        assert [r.payload for r in s.read(0, 5)] == [b"p0", b"p1", b"p2", b"p3", b"p4"]


def test_second_writer_is_refused_but_readers_are_not(tmp_path):
    with Spool(tmp_path) as s:
        s.append(recs(2))
        with pytest.raises(SpoolError, match="already has a writer"):
            Spool(tmp_path)
        reader = Spool(tmp_path, readonly=True)
        assert [r.offset for r in reader.read(0, 10)] == [0, 1]
        with pytest.raises(SpoolError, match="not open for writing"):
            reader.append(recs(1))


def test_reader_needs_an_existing_spool(tmp_path):
    with pytest.raises(SpoolError, match="no spool"):
        Spool(tmp_path / "missing", readonly=True)


def test_reader_sees_only_committed_records(tmp_path):
    with Spool(tmp_path) as s:
        s.append(recs(3))
    with open(tmp_path / "committed", "w") as f:
        f.write("2\n")
    reader = Spool(tmp_path, readonly=True)
    assert reader.latest_offset() == 2 and [r.offset for r in reader.read(0, 10)] == [0, 1]


@pytest.mark.parametrize("damage", ["cut_body", "cut_header", "flip_crc", "garbage_tail", "huge_length"])
def test_torn_tail_is_truncated_on_reopen(tmp_path, damage):
    with Spool(tmp_path) as s:
        s.append(recs(5))
    seg = tmp_path / segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    whole = len(data)
    rec_len = whole // 5   # all five records have the same length
    if damage == "cut_body":
        del data[whole - 3:]
    elif damage == "cut_header":
        del data[whole - rec_len + 5:]
    elif damage == "flip_crc":
        data[-1] ^= 0xFF
    elif damage == "garbage_tail":
        data += b"\x07\x00\x00"
    else:
        data += (MAX_RECORD + 1).to_bytes(4, "little") + b"\x00" * 12
    seg.write_bytes(bytes(data))
    with Spool(tmp_path) as s:
        kept = 5 if damage in ("garbage_tail", "huge_length") else 4
        assert s.recovered > 0 and s.latest_offset() == kept
        assert [r.payload for r in s.read(0, 10)] == [b"p%d" % i for i in range(kept)]
        assert list(s.append([(9.0, TOPIC, b"new")])) == [kept]
    with Spool(tmp_path) as s:
        assert s.recovered == 0 and s.read(kept, kept + 1)[0].payload == b"new"


def test_killed_writer_leaves_a_readable_prefix(tmp_path):
    """SIGKILL a writer in the middle of appending; reopening keeps a dense, intact prefix."""
    code = textwrap.dedent("""
        import sys
        from backend.spark.spool import Spool
        from edge.core import topics
        s = Spool(sys.argv[1], fsync="never", segment_bytes=1 << 16)
        i = 0
        while True:
            s.append([(float(i + k), topics.device("f", "x", "up"), b"%d" % (i + k) * 50) for k in range(100)])
            i += 100
            if i == 2000:
                print("go", flush=True)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=root,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"go\n"
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    with Spool(tmp_path) as s:
        n = s.latest_offset()
        assert n >= 2000 and len(segments(tmp_path)) > 1
        got = s.read(0, n)
        assert [r.offset for r in got] == list(range(n))
        assert all(r.payload == b"%d" % r.offset * 50 for r in got)


def test_segments_roll_and_trim_removes_only_whole_old_segments(tmp_path):
    with Spool(tmp_path, segment_bytes=200) as s:
        for i in range(20):
            s.append(recs(1, i))
        assert len(segments(tmp_path)) > 3
        assert s.trim(0) == 0
        earliest = s.trim(11)
        assert 0 < earliest <= 11
        assert [r.offset for r in s.read(11, 20)] == list(range(11, 20))
        with pytest.raises(SpoolError, match="trimmed"):
            s.read(0, 5)
        assert s.trim(10 ** 9) <= 19       # the active segment stays
        assert [r.offset for r in s.read(19, 20)] == [19]
    with Spool(tmp_path, readonly=True) as r:
        assert r.latest_offset() == 20 and r.earliest_offset() <= 19


def test_oversized_record_and_bad_policy_are_rejected(tmp_path):
    with Spool(tmp_path) as s:
        with pytest.raises(ValueError, match="larger than"):
            s.append([(0.0, TOPIC, b"x" * MAX_RECORD)])
        assert s.latest_offset() == 0
    with pytest.raises(ValueError, match="fsync"):
        Spool(tmp_path / "x", fsync="sometimes")


def test_a_bad_record_or_a_failed_write_appends_nothing_of_that_batch(tmp_path):
    class DiskFullAfterHalf:
        def __init__(self, f):
            self.f = f

        def write(self, blob):
            self.f.write(blob[:len(blob) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    with Spool(tmp_path) as s:
        s.append(recs(2))
        with pytest.raises(ValueError):
            s.append(recs(3, 2) + [(0.0, TOPIC, b"x" * MAX_RECORD)])
        real = s._file
        s._file = DiskFullAfterHalf(real)
        with pytest.raises(OSError):
            s.append(recs(3, 2))
        s._file = real
        assert s.latest_offset() == 2
        assert list(s.append(recs(1, 2))) == [2]
    with Spool(tmp_path) as s:
        assert s.recovered == 0 and [r.payload for r in s.read(0, 9)] == [b"p0", b"p1", b"p2"]


@pytest.mark.parametrize("policy", ["always", "never", 0.05])
def test_fsync_policies_store_the_same_records(tmp_path, policy):
    with Spool(tmp_path, fsync=policy) as s:
        s.append(recs(3))
        s.append(recs(2, 3))
    assert [r.payload for r in Spool(tmp_path, readonly=True).read(0, 5)] == [b"p%d" % i for i in range(5)]


# -- property test against an in-memory oracle -------------------------------------------------------
_payload = st.binary(max_size=40)
_record = st.tuples(st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([TOPIC, topics.device("f1", "ü", "state"), topics.query("f1", "q1", "spec"), ""]),
                    _payload)
_op = st.one_of(
    st.tuples(st.just("append"), st.lists(_record, max_size=12)),
    st.tuples(st.just("read"), st.integers(0, 80), st.integers(0, 80)),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("trim"), st.integers(0, 80)),
)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=25))
def test_spool_matches_a_list(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("spool")
    oracle = []           # oracle[i] is the record at offset i
    earliest = 0
    s = Spool(path, fsync="never", segment_bytes=256)
    try:
        for op in ops:
            if op[0] == "append":
                offsets = s.append(op[1])
                assert list(offsets) == list(range(len(oracle), len(oracle) + len(op[1])))
                oracle.extend(Record(o, float(a), t, p) for o, (a, t, p) in zip(offsets, op[1]))
            elif op[0] == "read":
                lo, hi = max(op[1], earliest), op[2]
                assert s.read(lo, hi) == oracle[lo:hi]
                assert Spool(path, readonly=True).read(lo, hi) == oracle[lo:hi]
            elif op[0] == "reopen":
                s.close()
                s = Spool(path, fsync="never", segment_bytes=256)
                assert s.recovered == 0
            else:
                prev, earliest = earliest, s.trim(op[1])
                assert prev <= earliest <= max(prev, min(op[1], len(oracle)))
                assert s.read(earliest, len(oracle)) == oracle[earliest:]
            assert s.latest_offset() == len(oracle)
    finally:
        s.close()
