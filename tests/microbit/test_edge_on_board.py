"""The portable edge tests that fit a micro:bit run on it (QEMU, MicroPython 1.9.2, float32, ~9 KB heap).

Of tests/edge, the interval filter's module compiles on the board (edge/core/interval.py, ~3 KB of heap);
codec.py does not compile in the heap, and sketch.py compiles but no sketch test then fits. Of the interval
tests, five run on the board. Two do not: the mirror test's random walk does not fit the heap, and the
zero-width test checks ``1.0000001`` against ``1.0``, below float32 resolution (they are the same number on
the board: the single-precision behaviour DESIGN.md §2 warns about)."""
import os
import time

import serial

from firmware.microbit import qemu
import onboard

FIT = ["test_reports_on_exit_and_recenters", "test_shrink_is_symmetric_and_rechecks_both_ends",
       "test_constraint_reports_on_crossing_only", "test_false_positive_and_false_negative_filters_are_silent",
       "test_explicit_bound_and_bad_bound"]


def test_interval_tests_on_the_board():
    b = qemu.Board()
    try:
        time.sleep(1.5)
        with serial.Serial(b.port, 115200, timeout=1) as s:
            r = onboard.run_file(s, os.path.join(onboard.ROOT, "tests", "edge", "test_interval.py"),
                                 [os.path.join(onboard.ROOT, "edge", "core", "interval.py")])
    finally:
        b.stop()
    for name, (ok, out) in sorted(r.items()):
        print("micro:bit %s %s" % ("PASS" if ok else "does not fit/float32:", name))
    assert [n for n in FIT if not r[n][0]] == [], {n: r[n][1] for n in FIT}
    float32 = r["test_infinite_width_never_reports_and_zero_width_reports_every_change"]
    assert not float32[0] and "AssertionError" in float32[1]            # 1.0000001 == 1.0 in float32
