"""Answer table: level compaction keeps the file count bounded and every row, in order (list oracle)."""
import json
import math
import os
import random

import pyarrow as pa
import pytest

from backend.spark.answers import Table, read_answers


def rows(batch, n):
    return pa.table({"batch": pa.array([batch] * n, pa.int64()), "seq": pa.array(range(n), pa.int32()),
                     "fields": pa.array([json.dumps({"query": "q", "b": batch, "i": i}) for i in range(n)])})


def fill(table, batches, rng, compact=True):
    """Write batches 0..batches-1 (some without answers), compacting after each; returns the oracle."""
    expect = []
    for b in range(batches):
        n = rng.choice([0, 1, 3])
        if n:
            table.write(b, rows(b, n))
            expect += [{"query": "q", "b": b, "i": i} for i in range(n)]
        if compact:
            table.compact(b)
    return expect


@pytest.mark.parametrize("fan", [2, 4, 16])
def test_compaction_bounds_files_and_keeps_every_answer_in_order(tmp_path, fan):
    table = Table(str(tmp_path / "answers"), fan=fan)
    batches = 600
    expect = fill(table, batches, random.Random(fan))
    files = table.files()
    levels = 1 + math.log(batches, fan)
    assert len(files) <= fan * levels, files
    assert len(os.listdir(table.dir)) == len(files)       # nothing left behind
    got = read_answers(str(tmp_path))
    assert got == expect
    # an upper batch bound cuts inside merged files too
    assert read_answers(str(tmp_path), upto=137) == [r for r in expect if r["b"] <= 137]


def test_without_compaction_there_is_a_file_per_batch(tmp_path):
    """The comparison above is not vacuous: the same run without compaction has hundreds of files."""
    table = Table(str(tmp_path / "answers"), fan=4)
    expect = fill(table, 600, random.Random(4), compact=False)
    assert len(table.files()) == len({r["b"] for r in expect}) > 300


def test_batches_after_upto_are_not_merged_and_a_replay_overwrites_its_own_file(tmp_path):
    table = Table(str(tmp_path / "answers"), fan=2)
    for b in range(6):
        table.write(b, rows(b, 2))
    table.compact(3)                    # batches 4, 5 not delivered in full: left alone
    assert [(f[0], f[1]) for f in table.files()] == [(0, 3), (4, 4), (5, 5)]
    table.write(5, rows(5, 2))          # the replay of batch 5 writes the same rows again
    assert [r["b"] for r in read_answers(str(tmp_path))] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_a_crash_between_merge_and_delete_leaves_no_duplicates(tmp_path):
    table = Table(str(tmp_path / "answers"), fan=4)
    expect = fill(table, 8, random.Random(1), compact=False)
    real_remove = os.remove
    calls = []

    def crash_after_first(path):
        if calls:
            raise KeyboardInterrupt("crash")
        calls.append(path)
        real_remove(path)
    os.remove = crash_after_first
    try:
        with pytest.raises(KeyboardInterrupt):
            table.compact(7)
    finally:
        os.remove = real_remove
    assert len(os.listdir(table.dir)) > len(table.files())     # merged file and most of its inputs
    assert read_answers(str(tmp_path)) == expect                # readers skip the covered inputs
    table.compact(7)
    assert len(os.listdir(table.dir)) == len(table.files())
    assert read_answers(str(tmp_path)) == expect


def test_bad_fan_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        Table(str(tmp_path), fan=1)


def test_a_reader_beside_a_compaction_lists_again_and_loses_no_row(tmp_path):
    """The demo reads the table while the job compacts it: a file listed and then merged away is read from the
    merged file (oracle: the rows written; before, the reader raised FileNotFoundError)."""
    table = Table(str(tmp_path / "answers"), fan=2)
    expect = fill(table, 8, random.Random(3), compact=False)
    listing = Table.files
    calls = []

    def racing(self):
        got = listing(self)
        if not calls:               # the job compacts right after the reader listed
            calls.append(len(got))
            table.compact(7)
        return got
    Table.files = racing
    try:
        got = read_answers(str(tmp_path))
    finally:
        Table.files = listing
    assert calls and len(table.files()) < calls[0]      # files did go away under the reader
    assert [json.loads(json.dumps(a)) for a in got] == expect
