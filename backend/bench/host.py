"""The shared path's CPU per record, no Spark (DESIGN.md §8): decode -> Host -> coordinator -> answer rows.

Run ``python -m backend.bench.host [--devices 2000] [--rate 2000] [--seconds 60] [--batch-s 0.5] [--profile N]``;
a benchmark, not a test. It replays the Spark bench's workload (``backend.spark.bench_job``: ``--devices``
single-source devices born at once, one sum query per 10 sources, protocol ``naive`` with λ = 0, then
reports round robin at ``--rate`` per second of record time, each ±0.5 from the last) through
``job.run_batch`` in batches of ``--batch-s`` seconds of records, as the job's Python worker runs a batch
(the heap frozen after the births, as ``state.GroupState`` does), and prints the process CPU per record
over the reports, the births apart. ``--profile N`` prints cProfile's top N functions by own time.
The Spark job's maximum sustained rate on one core is bounded by 1 / (this per record + Spark's own per
record, ``backend.spark.bench_max``).
"""
import argparse
import cProfile
import gc
import hashlib
import io
import json
import pstats
import sys
import time

from backend import host
from backend.spark import job
from backend.spark.bench_job import births, fleet_report
from edge.core import topics


def reports(devices, rate, count, t0):
    """``count`` of the bench feeder's reports ``(arrival, topic, payload)`` (``bench_job.births``' form),
    stamped ``rate`` per second of record time from ``t0``: device ``k % devices`` reports ``k``-th, ±0.5."""
    seq, value = [1] * devices, [100.0] * devices
    for k in range(count):
        yield fleet_report(k, seq, value, t0 + (k + 1) / rate)[1]


def as_records(triples):
    """``births``' ``(now, topic, payload)`` as the job's records ``(arrival, name, channel, payload, retained)``."""
    out = []
    for now, topic, payload in triples:
        parsed = topics.parse(topic)
        out.append((now, parsed[2], parsed[3], payload, False))
    return out


def run(devices=2000, rate=2000, seconds=60.0, batch_s=0.5, profile=None):
    """``(µs per report record, answer rows, sha256 of every output row and the host's digest at the end)``;
    ``profile``: a cProfile.Profile enabled over the reports (outputs are hashed after the timing)."""
    t0 = 1.7e9
    h = host.Host(host.settings(protocol="naive", period=10.0, latency=0.0))
    job.run_batch(h, as_records(births(devices, t0)))
    gc.collect()
    gc.freeze()             # as the job's worker does once its Hosts are held (state._freeze)
    recs = as_records(reports(devices, rate, int(rate * seconds), t0))
    per = max(1, int(rate * batch_s))
    outs = []
    if profile is not None:
        profile.enable()
    start = time.process_time()
    for i in range(0, len(recs), per):
        outs.append(job.run_batch(h, recs[i:i + per]))
    spent = time.process_time() - start
    if profile is not None:
        profile.disable()
    gc.unfreeze()
    sha = hashlib.sha256()
    for cols in outs:
        for kind, target, payload, body in zip(cols["kind"], cols["target"], cols["payload"], cols["body"]):
            sha.update(repr((kind, target, payload, body if kind != "status" else None)).encode())
    sha.update(json.dumps(host.digest(h), sort_keys=True).encode())
    return 1e6 * spent / max(1, len(recs)), sum(c["kind"].count("answer") for c in outs), sha.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--rate", type=int, default=2000, help="reports per second of record time")
    ap.add_argument("--seconds", type=float, default=60.0, help="record time replayed")
    ap.add_argument("--batch-s", type=float, default=0.5, help="records per run_batch call, in seconds of the rate")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions by own time")
    args = ap.parse_args(argv)
    prof = cProfile.Profile() if args.profile else None
    us, answers, sha = run(args.devices, args.rate, args.seconds, args.batch_s, prof)
    print("host per report record: %.1f us CPU (%d reports, %d answer changes, %d devices, rate %d/s, batches of "
          "%g s) = %d records/s on one core; outputs sha256 %s" % (us, int(args.rate * args.seconds), answers, args.devices,
                                                                    args.rate, args.batch_s, 1e6 / us, sha[:16]))
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
