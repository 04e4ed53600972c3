"""Maximum sustained rate of the Spark job on Kafka, against Spark's own floor measured the same way (DESIGN.md §8).

Run ``python -m backend.spark.bench_max [--devices 2000] [--start 2000] [--batch-s 2]``; a benchmark, not a
test. Each step is one ``bench_job.measure`` run (``--ingest kafka``: a KRaft broker on loopback, the
bench's fleet and feeder) at one offered rate, with every micro-batch bounded by Spark's
``maxOffsetsPerTrigger`` to ``--batch-s`` seconds of the offered rate: over capacity the backlog then
grows batch after batch, where an unbounded source reads it all in one batch and hides it. A step keeps
up when its backlog (records fed but not applied) grew by at most one bounded batch over the measured
window, the job drained it afterwards, and the feeder offered what was asked (else the feeder, not the
job, is the limit and the search stops there). The offered rate doubles from ``--start`` until a step
fails, then ``--refine`` bisections narrow it. Spark's no-op floor (``bench_job.floor_processor``) is
searched the same way on the same source, from the job's result, and the ratio of the two maxima printed.
``--groups N`` runs both keyed by query group (``bench_job --groups``: N sum queries over blocks of the
sources, 2 shuffle partitions), so independent groups run on parallel tasks.

``--drain`` measures both without a feeder in the way (the rate search above stops where its feeder, one
Python thread beside the job, cannot offer more: a floor it finds is the feeder's): the bench's workload
(births, then ``--records`` reports stamped ``--rate`` per second of record time, ``backend.bench.host``)
is produced into the topic first, then the job, and after it the no-op floor on a topic filled the same
way, drain it from the start with every batch bounded to ``--drain-batch`` records. The Host's clock is its
records' time, so the job applies exactly what it would live. A drain's rate is the records applied from
the end of its ``SKIP``-th batch (the births and each worker's first batches behind) to its last, over the
time between: the maximum sustained rate at that batch size, job and floor alike, and their ratio; for the job
also its Python worker's ``Host`` time per record, wall and thread CPU (the cores are shared: CPU does not
follow the load), to set beside ``python -m backend.bench.host`` (the same per record with no Spark).
``--job-only`` / ``--floor-only`` drain one of the two.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from backend import host
from backend.bench.host import reports
from backend.live.broker import Broker
from backend.spark import bench_job, job
from backend.spark.state import SNAPSHOT_RECORDS

KEEP_OFFERED = 0.95     # a step whose feeder offered less than this share of its rate is feeder-bound
SKIP = 2                # drain: batches before the timed ones (the births, each worker's first batch)
FILL = 20000            # drain: records produced per append while filling the topic


def kept_up(f):
    """Whether a ``measure`` result kept up: its backlog grew by at most one bounded batch, then drained."""
    return f["drained"] and f["lag_growth"] <= f["max_offsets"]


def search(run, start, refine, top):
    """The largest rate ``run(rate)`` (a ``measure`` result) keeps up with: doubling from ``start`` up to
    ``top``, then ``refine`` bisections; returns ``(rate or 0, [(rate, result), ...], feeder_bound)``."""
    lo, hi, rate, steps, bisections = 0, None, start, [], 0
    while rate:
        f = run(rate)
        steps.append((rate, f))
        if f["offered_per_s"] < KEEP_OFFERED * rate:
            return lo, steps, True
        if kept_up(f):
            lo = rate
        else:
            hi = rate
        if hi is None:
            rate = 2 * rate if 2 * rate <= top else 0
        elif bisections < refine and hi - lo > 1:
            bisections += 1
            rate = (lo + hi) // 2
        else:
            rate = 0
    return lo, steps, False


def drain(floor, devices=2000, records=320000, rate=8000, batch=16000, trigger=0.25, kafka_partitions=2, timeout=900.0,
          kafka=None, spark=None):
    """Fill a topic with the bench's births and ``records`` reports, then drain it with the job (or the no-op
    floor), ``batch`` records a micro-batch at most; returns ``{"rate": records/s, "batches": timed batches,
    "records": applied in them, "seconds": their time, "median_ms": median batch time, "total": records in
    the topic, "sizes": every batch's records, "host_us", "host_cpu_us", "store_us": the worker's per record}``.
    ``kafka``, ``spark``: a running broker and session to use (else started and stopped here)."""
    from backend.spark.kafkabroker import KafkaBroker
    from backend.spark.kafkalog import KafkaLog, Topic
    root = tempfile.mkdtemp(prefix="qf-bench-drain-")
    own = kafka is None, spark is None
    kafka = kafka or KafkaBroker(os.path.join(root, "kafka"), partitions=kafka_partitions).start()
    broker = Broker(os.path.join(root, "broker"), "bench", [], autosave=60).start()
    pub = bench_job._Publisher(broker.host, broker.port, "backend", broker.credentials("backend")[1], "qf-bench-drain")
    name = "qf.bench.%s" % os.path.basename(root)       # (a topic of its own on a shared broker)
    log = KafkaLog(kafka.bootstrap, name, "bench", partitions=kafka_partitions)
    q, done = None, []
    try:
        t0 = float(int(time.time()))
        log.append(bench_job.births(devices, t0))
        chunk = []
        for r in reports(devices, rate, records, t0):
            chunk.append(r)
            if len(chunk) == FILL:
                log.append(chunk)
                chunk = []
        log.append(chunk)
        total = log.latest_offset()
        spark = spark or job.session("local[*]", app="qf-bench-drain")

        def on_batch(batch_id, status, answers, published_at):
            last = [g["last_offset"] + 1 for g in status.values() if g.get("last_offset") is not None]
            done.append((published_at, max(last + [done[-1][1] if done else 0]),
                         sum(g.get("host_s", 0.0) for g in status.values()), sum(g.get("store_s", 0.0) for g in status.values()),
                         sum(g.get("host_cpu_s", 0.0) for g in status.values())))

        settings = host.settings(protocol="naive", period=10.0, latency=0.0)
        processor = bench_job.floor_processor() if floor else job._processor_class()(settings, snapshot_records=SNAPSHOT_RECORDS)
        q = job.start(spark, Topic(kafka.bootstrap, name, maxOffsetsPerTrigger=batch), os.path.join(root, "out"),
                      "bench", settings, publisher=pub, trigger=trigger, on_batch=on_batch, processor=processor)
        end = time.time() + timeout
        while (not done or done[-1][1] < total) and time.time() < end:
            time.sleep(0.05)
        if not done or done[-1][1] < total or len(done) < SKIP + 2:
            raise RuntimeError("the drain did not finish: %d of %d records in %d batches" % (
                done[-1][1] if done else 0, total, len(done)))
        timed = done[SKIP:]
        spans = sorted(b[0] - a[0] for a, b in zip(timed, timed[1:]))
        seconds, applied = timed[-1][0] - timed[0][0], timed[-1][1] - timed[0][1]
        return {"rate": applied / seconds, "batches": len(timed) - 1, "records": applied, "seconds": seconds,
                "median_ms": 1000 * spans[len(spans) // 2], "total": total,
                "sizes": [b[1] - a[1] for a, b in zip([(0, 0)] + done, done)],
                "host_us": 1e6 * sum(b[2] for b in timed[1:]) / applied, "store_us": 1e6 * sum(b[3] for b in timed[1:]) / applied,
                "host_cpu_us": 1e6 * sum(b[4] for b in timed[1:]) / applied}
    finally:
        if q is not None:
            q.stop()
        if spark is not None and own[1]:
            spark.stop()
        pub.close()
        log.close()
        broker.stop()
        if own[0]:
            kafka.stop()
        shutil.rmtree(root, ignore_errors=True)


def drains(args):
    """``--drain``: the job's and the floor's drain rates (one after the other) and their ratio."""
    found = {}
    for floor in (False,) if args.job_only else (True,) if args.floor_only else (False, True):
        load = "%.1f" % os.getloadavg()[0]
        f = drain(floor, args.devices, args.records, args.rate, args.drain_batch, args.trigger, args.kafka_partitions)
        found[floor] = f["rate"]
        print("%s drained %d records in %d batches of <= %d in %.1f s: %d records/s = %.1f us a record (median batch "
              "%d ms%s; %d devices, reports at %d/s of record time); load %s before" % (
                  "Spark floor" if floor else "job", f["records"], f["batches"], args.drain_batch, f["seconds"],
                  f["rate"], 1e6 / f["rate"], f["median_ms"], "" if floor else
                  "; Python worker host %.1f us (%.1f us CPU), state store %.1f us a record" % (
                      f["host_us"], f["host_cpu_us"], f["store_us"]),
                  args.devices, args.rate, load), flush=True)
    if len(found) == 2:
        print("ratio to Spark's floor (drain, batches of <= %d records): %.2f" % (args.drain_batch, found[False] / found[True]))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--start", type=int, default=2000, help="first offered reports/s")
    ap.add_argument("--top", type=int, default=128000, help="highest offered reports/s tried")
    ap.add_argument("--refine", type=int, default=2, help="bisections after the first failing step")
    ap.add_argument("--batch-s", type=float, default=bench_job.CAUGHT_UP,
                    help="maxOffsetsPerTrigger as seconds of the offered rate")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured feeding time per step")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--trigger", type=float, default=0.25)
    ap.add_argument("--kafka-partitions", type=int, default=2)
    ap.add_argument("--groups", type=int, default=0,
                    help="key the job by query group: N sum queries over blocks of the sources (bench_job --groups)")
    ap.add_argument("--partitions", type=int, default=None, help="shuffle partitions (default 1, 2 with --groups)")
    ap.add_argument("--job-only", action="store_true", help="the job alone (no floor)")
    ap.add_argument("--drain", action="store_true", help="fill the topic first, then time the job and the floor draining it")
    ap.add_argument("--records", type=int, default=320000, help="--drain: reports in the topic")
    ap.add_argument("--rate", type=int, default=8000, help="--drain: reports per second of record time")
    ap.add_argument("--floor-only", action="store_true", help="--drain: the floor alone (no job)")
    ap.add_argument("--drain-batch", type=int, default=16000, help="--drain: maxOffsetsPerTrigger")
    args = ap.parse_args(argv)
    if args.drain:
        return drains(args)
    found = {}
    for floor in (False,) if args.job_only else (False, True):
        def run(rate, floor=floor):
            load = "%.1f" % os.getloadavg()[0]       # the bench shares its cores: the 1-minute load before the step
            f = bench_job.measure(rate, args.seconds, args.devices, args.trigger, floor=floor, warmup=args.warmup,
                                  groups=args.groups, partitions=args.partitions or (2 if args.groups else 1),
                                  ingest="kafka", kafka_partitions=args.kafka_partitions,
                                  max_offsets=max(1, int(rate * args.batch_s)))
            print("%s at %d/s offered (%d/s fed): %s; backlog grew %d records (bound %d), %s; batches %d, median %d "
                  "records; p50 %.2f s, p99 %.2f s; load %s" % (
                      "floor" if floor else "job", rate, f["offered_per_s"], "kept up" if kept_up(f) else "FELL BEHIND",
                      f["lag_growth"], f["max_offsets"], "drained" if f["drained"] else "not drained in 60 s",
                      f["batches"], f["batch_median"], f["p50_s"], f["p99_s"], load), flush=True)
            return f
        best, steps, bound = search(run, found.get(False, args.start) or args.start, args.refine, args.top)
        found[floor] = best
        print("%s: max sustained %d reports/s%s (maxOffsetsPerTrigger %g s of the rate, %d devices, %d steps)" % (
            "Spark floor" if floor else "job", best, " [the feeder could not offer more: a lower bound]" if bound else "",
            args.batch_s, args.devices, len(steps)) + (", %d query groups" % args.groups if args.groups else ""), flush=True)
    if True in found:
        print("ratio to Spark's floor: max sustained %.2f" % (found[False] / max(found[True], 1e-9)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
