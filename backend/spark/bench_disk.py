"""Disk use of the Spark job after N micro-batches, with and without retention (DESIGN.md §6, §8).

Run ``python -m backend.spark.bench_disk [--batches 60] [--reports 400] [--devices 50]``; a benchmark,
not a test. Each batch appends ``--reports`` naive reports (every one changes an answer) to a spool of
64 KB segments and waits until the job delivered it. ``retention`` is the job as shipped (spool trimmed
behind Spark's commits, answer table merged 16 files a level, 20 batches of checkpoint history);
``none`` keeps every spool segment, one answer file per batch and Spark's default 100 batches.
Prints files and bytes of the spool, the answer table and the checkpoint for both.
"""
import argparse
import os
import shutil
import tempfile
import time

from backend.spark import job
from backend.spark.spool import Spool
from edge.core import codec, topics

FLEET = "disk"
SEGMENT = 64 << 10


def usage(path):
    files = size = 0
    for base, _, names in os.walk(path):
        for n in names:
            files += 1
            size += os.path.getsize(os.path.join(base, n))
    return files, size


def records(devices, batch, reports):
    """The records of batch ``batch``: births and a sum query first, then naive reports."""
    t = 1000.0 + batch
    out = []
    if batch == 0:
        for d in range(devices):
            out.append((t, topics.device(FLEET, "d%d" % d, "state"), codec.encode("birth", {
                "seq": 1, "t": t, "boot": 1, "fw": "b", "caps": 0, "first": 0,
                "sources": [{"name": "s%d" % d, "epoch": 0, "width": 0.0, "v": 0.0}]})))
        out.append((t, topics.query(FLEET, "total", "spec"), b'{"kind": "sum", "sources": "all", "precision": 0}'))
    for i in range(reports):
        d = i % devices
        seq = 2 + batch * (reports // devices + 1) + i // devices
        out.append((t + i / reports, topics.device(FLEET, "d%d" % d, "up"), codec.encode("report", {
            "src": 0, "epoch": 0, "seq": seq, "t": t + i / reports, "v": float(i), "why": 0})))
    return out


def run(spark, workdir, mode, batches, reports, devices):
    spool_dir, out = os.path.join(workdir, "spool"), os.path.join(workdir, "out")
    delivered = []
    with Spool(spool_dir, fsync="never", segment_bytes=SEGMENT) as sp:
        sink = job.Sink(out, FLEET, on_batch=lambda b, *a: delivered.append(b),
                        spool=sp if mode == "retention" else None)
        if mode == "none":
            sink.table.fan = 10 ** 9
        retain = job.RETAIN_BATCHES if mode == "retention" else 100     # 100: Spark's default
        spark.conf.set("spark.sql.streaming.minBatchesToRetain", str(retain))
        q = job.start(spark, spool_dir, out, FLEET, {"protocol": "naive", "period": 1.0}, trigger=0.1, sink=sink)
        try:
            for b in range(batches):
                sp.append(records(devices, b, reports))
                deadline = time.monotonic() + 120
                while len(delivered) <= b and q.isActive and time.monotonic() < deadline:
                    time.sleep(0.02)
                if len(delivered) <= b:
                    raise RuntimeError("the job did not deliver batch %d: %s" % (b, q.exception()))
        finally:
            q.stop()
    return {"spool": usage(spool_dir), "answers": usage(os.path.join(out, "answers")),
            "checkpoint": usage(os.path.join(out, "checkpoint"))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--reports", type=int, default=400)
    ap.add_argument("--devices", type=int, default=50)
    args = ap.parse_args(argv)
    spark = job.session("local[2]", app="qf-bench-disk")
    root = tempfile.mkdtemp(prefix="qf-bench-disk-")
    try:
        for mode in ("retention", "none"):
            t = time.monotonic()
            got = run(spark, os.path.join(root, mode), mode, args.batches, args.reports, args.devices)
            print("%-9s after %d batches (%.0f s): " % (mode, args.batches, time.monotonic() - t) +
                  ", ".join("%s %d files %.1f KB" % (k, v[0], v[1] / 1024) for k, v in got.items()), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
