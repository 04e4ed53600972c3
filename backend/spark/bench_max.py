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
"""
import argparse
import os
import sys

from backend.spark import bench_job

KEEP_OFFERED = 0.95     # a step whose feeder offered less than this share of its rate is feeder-bound


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
    ap.add_argument("--job-only", action="store_true", help="search the job alone (no floor)")
    args = ap.parse_args(argv)
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
