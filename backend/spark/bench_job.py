"""Spark job benchmark (DESIGN.md §8): sustained reports/s and reading -> published answer latency.

Run ``python -m backend.spark.bench_job [--rate 20000] [--seconds 30] [--trigger 0.25]``; a
benchmark, not a test. A feeder thread plays devices and bridge at once: every 50 ms it appends
``rate/20`` codec reports (stamped with the wall clock, which is also their arrival) to the spool,
which the job (``local[*]``, RocksDB, real Mosquitto for ctl and retained answers) consumes with a
processing-time trigger. Protocol ``naive`` with λ = 0, so every report changes one answer at once;
the latency of a report is the time its batch's answers were published minus its reading time.
Workload: ``--devices`` single-source devices, one sum query per 10 sources. A device silent for 30 s sends
a mark (its heartbeat, as an agent does), from its birth on: until the job's first batch the fleet sends
marks alone, then reports round robin (50,000 devices at 2,000 reports/s: one every 25 s each); the
measurement starts once the job caught up (``--warmup`` s after its first batch at the soonest, at most
60 s later), and the time it took is printed.

``--register N`` adds N silent devices held in state (born, in no query) to show that per-batch cost
does not follow the fleet; the job snapshots its state at its own cadence (in the background, ``--snapshot-records``
to change it: N births alone are one snapshot's worth from 200,000 on) and prints the state bytes per
source of the last snapshot installed. Each run also prints Spark's per-batch phases (``durationMs``), the Python worker's time per
batch (host and state store) and whether the group's Host was found cached in the worker.

``--groups N`` keys the job by query group (``job.start(groups=True)``) with N sum queries over blocks
of the sources (``--groups 1``: one SUM over every source, one huge group) and 2 shuffle partitions
(``--partitions``), so independent groups run in parallel.

``--ingest kafka`` runs the same workload through Kafka instead of the spool: a KRaft broker on loopback
(``backend.spark.kafkabroker``), the feeder producing through the bridge's ``KafkaLog`` (idempotent,
each append waits for Kafka's acknowledgement, as the bridge does before acknowledging MQTT; routed by
query group with ``--groups``) and the job reading Spark's own Kafka source; ``--compare`` then measures
the floor on the same Kafka source.

``--floor`` runs Spark's own floor instead: a no-op ``transformWithStateInPandas`` (reads the rows,
keeps a ValueState counter, emits one status row) over the same source, trigger, offered rate and
sink, whose latency is measured on an even sample of each batch's arrival times. ``--compare`` runs
the floor and then the job and prints the job's ratios to it; ``--floor-ref N`` gives the floor's
sustained rate from an earlier run instead.
"""
import argparse
import collections
import json
import math
import os
import shutil
import sys
import tempfile
import time

from backend import host
from backend.live.broker import Broker
from backend.spark import job, quickack, zipcache
from backend.spark.state import SNAPSHOT_RECORDS
from backend.spark.spool import Spool
from edge.core import codec, topics

TARGET_RATE, TARGET_P99 = 20000, 1.5
FLOOR_SAMPLE = 100      # arrival times per batch the floor's status row carries for its latency
MARK_AFTER = 30.0       # s of silence after which a bench device sends a mark (B before it is timed is 32 s:
                        # heartbeat.START as a power of 2; marking sooner only adds records)
DRAIN_WAIT = 60.0       # s the warm-up waits at most beyond --warmup for the start-up backlog to drain
CAUGHT_UP = 2.0         # s: the job is caught up once what it has not applied yet is this long's worth


def floor_processor():
    """A StatefulProcessor that does nothing but Spark's part: read the rows, count them in a
    ValueState, emit one status row (``records`` total, ``batch_records``, sampled ``arrivals``)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Floor(StatefulProcessor):
        def init(self, handle):
            zipcache.install()      # as the job's processor does: the floor measures Spark, not Python 3.11's zipimport
            quickack.install(handle)
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            pdf = pd.concat(list(rows), ignore_index=True)
            arrivals, last = sorted(pdf["arrival"].tolist()), int(pdf["offset"].max())
            n = len(arrivals)
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            step = max(1, n // FLOOR_SAMPLE)
            body = json.dumps({"records": total, "batch_records": n, "arrivals": arrivals[::step],
                               "last_offset": last})
            cols = {c: [None] for c in job.COLUMNS}
            cols.update(kind=["status"], body=[body], grp=[key[0]], seq=[0], at=[None])
            yield pd.DataFrame(cols)

        def close(self):
            pass

    return Floor()


def births(devices, now, register=0, groups=0):
    """Births of ``devices`` reporting devices and ``register`` silent ones (``r<i>``, source ``x<i>``,
    in state but in no query), then one sum query per 10 reporting sources; with ``groups`` > 0 first
    ``groups`` sum queries over consecutive blocks of the reporting sources (one query group each; 1:
    one SUM over every source), so every device is born into its group."""
    out = []
    for g in range(groups):
        spec = {"kind": "sum", "sources": ["s%d" % d for d in range(devices * g // groups, devices * (g + 1) // groups)],
                "precision": 5.0}
        out.append((now, topics.query("bench", "g%d" % g, "spec"), json.dumps(spec).encode()))
    for d in range(register):
        out.append((now, topics.device("bench", "r%d" % d, "state"), codec.encode("birth", {
            "seq": 1, "t": now, "boot": 1, "fw": "bench", "caps": 0, "first": 0,
            "sources": [{"name": "x%d" % d, "epoch": 0, "width": 0.0, "v": 100.0}]})))
    for d in range(devices):
        out.append((now, topics.device("bench", "d%d" % d, "state"), codec.encode("birth", {
            "seq": 1, "t": now, "boot": 1, "fw": "bench", "caps": 0, "first": 0,
            "sources": [{"name": "s%d" % d, "epoch": 0, "width": 0.0, "v": 100.0}]})))
    for g in range(0 if groups else devices // 10):
        spec = {"kind": "sum", "sources": ["s%d" % (10 * g + i) for i in range(10)], "precision": 5.0}
        out.append((now, topics.query("bench", "g%d" % g, "spec"), json.dumps(spec).encode()))
    return out


def fleet_report(k, seq, value, now):
    """The ``k``-th report of the bench fleet (0-based; ``seq``, ``value``: every device's latest, updated here),
    round robin over the devices, each ±0.5 from its last: ``(device, (now, topic, payload))``."""
    d = k % len(seq)
    seq[d] += 1
    value[d] += 0.5 if ((k + 1) * 2654435761) & 1024 else -0.5
    return d, (now, topics.device("bench", "d%d" % d, "up"), codec.encode("report", {
        "src": 0, "epoch": 0, "seq": seq[d], "t": now, "v": value[d], "why": 0}))


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


class _Publisher(job.Publisher):
    """The job's publisher, waiting longer for acks (the births of a big fleet send a config each) and
    dropping the downlinks of the silent registered devices (no agent listens to them)."""

    def publish(self, topic, payload, qos, retain=False):
        if "/d/r" not in topic:
            job.Publisher.publish(self, topic, payload, qos, retain)

    def flush(self, timeout=900.0):
        job.Publisher.flush(self, timeout)


def measure(rate=TARGET_RATE, seconds=30.0, devices=2000, trigger=0.25, master="local[*]", floor=False,
            register=0, groups=0, partitions=1, verbose=False, warmup=0.0, snapshot_records=None, ingest="spool",
            kafka_partitions=2, max_offsets=None):
    """Feed ``rate`` reports/s for ``seconds`` through the job (or Spark's floor); return the figures.
    ``groups`` > 0: the job keyed by query group over that many groups, ``partitions`` shuffle partitions;
    ``ingest``: ``spool`` or ``kafka`` (a broker on loopback, a topic of ``kafka_partitions``, at most
    ``max_offsets`` records a batch: Spark's ``maxOffsetsPerTrigger``, ``backend.spark.bench_max``)."""
    root = tempfile.mkdtemp(prefix="qf-bench-job-")
    kafka = None
    if ingest == "kafka":
        from backend.spark.kafkabroker import KafkaBroker
        kafka = KafkaBroker(os.path.join(root, "kafka"), partitions=kafka_partitions).start()
    broker = Broker(os.path.join(root, "broker"), "bench", [], autosave=60).start()
    spark = job.session(master, app="qf-bench-job", partitions=partitions)
    lat, batches, rebuilt, snaps, worker = [], [], [], [], []
    state = {"measure_from": None}

    def on_batch(batch_id, status, answers, published_at):
        gs = [g for _, g in sorted(status.items())]       # one status row per group in the batch
        done = max([g["last_offset"] + 1 for g in gs if g.get("last_offset") is not None] or [batches[-1][1] if batches else 0])
        batches.append((published_at, done, sum(g.get("batch_records", 0) for g in gs)))
        rebuilt.extend(g.get("rebuilt") for g in gs)
        if any(g.get("snapshot_bytes") for g in gs):
            snaps.append((sum(g.get("snapshot_bytes") or 0 for g in gs), sum(g["sources_known"] for g in gs)))
        if verbose:
            print("batch %d: %d records, host %s ms, store %s ms, %s, latency of its oldest record %.2f s" % (
                batch_id, batches[-1][2], "+".join("%d" % (1000 * g.get("host_s", 0)) for g in gs),
                "+".join("%d" % (1000 * g.get("store_s", 0)) for g in gs),
                ",".join({False: "cached", True: "rebuilt"}.get(g.get("rebuilt"), str(g.get("rebuilt"))) for g in gs),
                published_at - min([g["first_arrival"] for g in gs if g.get("first_arrival") is not None] or [published_at])), flush=True)
        if state["measure_from"] is not None and any("host_s" in g for g in gs):
            worker.append((sum(g.get("host_s", 0) for g in gs), sum(g.get("store_s", 0) for g in gs)))
        if state["measure_from"] is None:
            return
        if floor:
            for g in gs:
                sample = g.get("arrivals", [])
                weight = max(1, g.get("batch_records", 0) // max(1, len(sample)))
                lat.extend(published_at - t for t in sample if t >= state["measure_from"] for _ in range(weight))
        else:
            lat.extend(published_at - t for t in answers.column("time").to_pylist() if t >= state["measure_from"])

    pub = _Publisher(broker.host, broker.port, "backend", broker.credentials("backend")[1], "qf-bench-job")
    if kafka is not None:
        from backend.spark.kafkalog import KafkaLog, Topic
        spool = KafkaLog(kafka.bootstrap, "qf.bench", "bench", partitions=kafka_partitions,
                         groups=os.path.join(root, "bridge-groups") if groups else None)
        source = Topic(kafka.bootstrap, "qf.bench", **({"maxOffsetsPerTrigger": max_offsets} if max_offsets else {}))
    else:
        spool = Spool(os.path.join(root, "spool"), fsync="never")
        source = spool.path
    q = None
    try:
        born = time.time()
        spool.append(births(devices, born, register, groups))
        settings = host.settings(protocol="naive", period=10.0, latency=0.0)
        # the job's snapshot cadence (``--snapshot-records``): a million births are a snapshot's worth
        processor = floor_processor() if floor else job._processor_class()(
            settings, snapshot_records=snapshot_records or (job.GROUP_SNAPSHOT_RECORDS if groups else SNAPSHOT_RECORDS))
        q = job.start(spark, source, os.path.join(root, "out"), "bench", settings, publisher=pub,
                      trigger=trigger, on_batch=on_batch,
                      source_options=None if kafka else {"minPartitionRecords": 4096, "maxPartitions": 2},
                      processor=processor,
                      groups=groups > 0)
        seq = [1] * devices
        value = [100.0] * devices
        fed, marks, k = [0], [0], [0]
        last = [born] * devices             # when each device last sent (its birth, a report, a mark)
        silent = collections.deque((born, d) for d in range(devices))      # (sent at, device), oldest first

        def feed(until, drained=None, quiet=False):
            """Feed until ``until`` and, with ``drained`` (a callable), on until it says the job caught up;
            ``quiet``: marks alone (an idle fleet's heartbeats)."""
            step = 0.05
            per = 0 if quiet else max(1, int(rate * step))
            nxt = time.time()
            while time.time() < until or drained is not None and not drained():
                now = time.time()
                recs = []
                for _ in range(per):
                    d, rec = fleet_report(k[0], seq, value, now)
                    k[0] += 1
                    recs.append(rec)
                    last[d] = now
                    silent.append((now, d))
                # a device silent for its heartbeat sends a mark (edge.core.delivery), as an agent would: the
                # fleet is born at once and the round robin reaches a device only every devices/rate seconds
                while silent and (silent[0][0] != last[silent[0][1]] or now - silent[0][0] >= MARK_AFTER):
                    at, d = silent.popleft()
                    if at == last[d]:
                        recs.append((now, topics.device("bench", "d%d" % d, "up"), codec.encode(
                            "mark", {"seq": seq[d], "t": now})))
                        marks[0] += 1
                        last[d] = now
                        silent.append((now, d))
                spool.append(recs)
                fed[0] += per
                nxt += step
                time.sleep(max(0.0, nxt - time.time()))

        # until the job's first batch the fleet is idle: its devices send their heartbeats (marks) alone, as a
        # fleet does whether the job has started yet or not. The measurement starts in steady state: ``warmup`` s
        # after that batch (every worker has met every group) and once the job caught up with what was fed
        # meanwhile: measuring while a backlog drains would charge start-up to steady state
        feed(0, lambda: bool(batches), quiet=True)
        warm_from = time.time()
        start_up = []           # [measure no sooner than, lag at the last batch seen, that batch's offset]

        def drained():
            """Whether to measure: the job caught up (what is fed but not applied is under CAUGHT_UP s of it), or it
            cannot (its lag grew from one batch to the next: over capacity, measured as such), or DRAIN_WAIT passed."""
            now = time.time()
            if not batches:
                return False
            if not start_up:
                start_up.extend([now + warmup, math.inf, -1])
            if now < start_up[0] or batches[-1][1] == start_up[2]:
                return now > start_up[0] + DRAIN_WAIT
            lag = spool.latest_offset() - batches[-1][1]
            grew, start_up[1:] = lag > start_up[1], [lag, batches[-1][1]]
            return lag <= CAUGHT_UP * rate or grew or now > start_up[0] + DRAIN_WAIT

        feed(warm_from, drained)
        state["measure_from"] = t0 = time.time()
        warmed = t0 - warm_from
        warm_drained = start_up[1] <= CAUGHT_UP * rate
        base_records, base_fed, base_marks, base_applied = spool.latest_offset(), fed[0], marks[0], batches[-1][1]
        feed(t0 + seconds)
        t1 = time.time()
        lag = (spool.latest_offset() - batches[-1][1], base_records - base_applied)    # records fed, not applied
        offered = fed[0] - base_fed
        target = spool.latest_offset()
        while batches[-1][1] < target and time.time() < t1 + 60:
            time.sleep(0.05)
        done_at = batches[-1][0]
        applied = batches[-1][1] - base_records
        in_window = [b for b in batches if t0 <= b[0] <= t1]
        phases = {}
        for p in q.recentProgress:
            if p.timestamp and p.numInputRows:
                for k, v in p.durationMs.items():
                    phases.setdefault(k, []).append(v)
        return {"ingest": "kafka (%d partitions)" % kafka_partitions if kafka else "spool",
                "devices": devices, "registered": register, "warmup_s": warmup, "warmed_s": round(warmed, 1),
                "warm_drained": warm_drained,
                "marks": marks[0] - base_marks, "queries": groups or devices // 10, "groups": groups,
                "partitions": partitions,
                "snapshot_bytes": snaps[-1][0] if snaps else None, "snapshot_sources": snaps[-1][1] if snaps else None,
                "worker_ms": [round(1000 * percentile([w[i] for w in worker], 0.5), 1) for i in (0, 1)] if worker else None, "protocol": "floor" if floor else "naive",
                "trigger_s": trigger,
                "master": master, "offered_per_s": round(offered / (t1 - t0)),
                "sustained_per_s": round(applied / (done_at - t0)) if done_at > t0 else 0,
                "drained": batches[-1][1] >= target, "batches": len(in_window), "lag_end": lag[0],
                "lag_growth": lag[0] - lag[1], "max_offsets": max_offsets,
                "batch_median": percentile([b[2] for b in in_window], 0.5) if in_window else 0,
                "phases_ms": {k: percentile(v, 0.5) for k, v in sorted(phases.items())},
                "rebuilt": sum(r is True for r in rebuilt), "caught_up": sum(r == "caught up" for r in rebuilt),
                "cache_hits": sum(not r for r in rebuilt),
                "answers": len(lat), "p50_s": round(percentile(lat, 0.5), 3), "p99_s": round(percentile(lat, 0.99), 3)}
    finally:
        if q is not None:
            q.stop()
        pub.close()
        spool.close()
        spark.stop()
        broker.stop()
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(root, ignore_errors=True)


def figures(quick=True):
    """Rows for the bench report: the job at a moderate rate and at the DESIGN target rate."""
    return [measure(rate=r, seconds=10.0 if quick else 30.0) for r in (5000, TARGET_RATE)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=TARGET_RATE, help="offered reports/s")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured feeding time")
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--register", type=int, default=0, help="silent devices also held in state (one source each)")
    ap.add_argument("--trigger", type=float, default=0.25, help="processing-time trigger in seconds")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--groups", type=int, default=0,
                    help="key the job by query group: N sum queries over blocks of the sources (1: one SUM over all)")
    ap.add_argument("--partitions", type=int, default=None, help="shuffle partitions (default 1, 2 with --groups)")
    ap.add_argument("--verbose", action="store_true", help="print a line per micro-batch")
    ap.add_argument("--snapshot-records", type=int, default=None,
                    help="journal records (at least one per source) between snapshots of the state (default: the job's)")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds fed at the same rate after the job's first batch before measuring (each worker's first "
                         "batch of a group rebuilds its Host); the measurement then also waits until the job caught up")
    ap.add_argument("--ingest", choices=("spool", "kafka"), default="spool",
                    help="the spool (default) or Kafka (a KRaft broker on loopback, Spark's Kafka source)")
    ap.add_argument("--kafka-partitions", type=int, default=2, help="partitions of the Kafka topic (--ingest kafka)")
    ap.add_argument("--max-offsets", type=int, default=None, help="maxOffsetsPerTrigger of the Kafka source (--ingest kafka)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--floor", action="store_true", help="run Spark's no-op floor instead of the job")
    mode.add_argument("--compare", action="store_true", help="run the floor, then the job, and print ratios")
    mode.add_argument("--floor-ref", type=float, help="the floor's sustained reports/s from an earlier run")
    args = ap.parse_args(argv)
    runs = [True] if args.floor else [True, False] if args.compare else [False]
    ref = {"sustained_per_s": args.floor_ref} if args.floor_ref else None
    for floor in runs:
        f = measure(args.rate, args.seconds, args.devices, args.trigger, args.master, floor, args.register,
                    args.groups, args.partitions or (2 if args.groups else 1), args.verbose, args.warmup,
                    args.snapshot_records, args.ingest, args.kafka_partitions, args.max_offsets)
        report(f)
        if floor:
            ref = f
        elif ref is not None:
            print("ratio to Spark's floor: sustained %.2f%s" % (
                f["sustained_per_s"] / max(ref["sustained_per_s"], 1e-9),
                ", p50 %.2f, p99 %.2f" % (f["p50_s"] / max(ref["p50_s"], 1e-9), f["p99_s"] / max(ref["p99_s"], 1e-9))
                if "p50_s" in ref else ""))
    return 0


def report(f):
    if f["protocol"] == "floor":
        print("Spark floor: no-op transformWithStateInPandas (ValueState counter, one status row per batch)")
    print("workload: %d single-source devices, %d sum queries of %d sources, protocol naive, lambda 0%s"
          % (f["devices"], f["queries"], f["devices"] // max(1, f["queries"]),
             ", %d silent devices registered" % f["registered"] if f["registered"] else ""))
    print("ingest: %s" % f["ingest"])
    print("state keys: %s" % ("one per query group (%d groups)" % f["groups"] if f["groups"] else "one (the fleet)"))
    print("trigger interval: %.2f s, master %s, spark.sql.shuffle.partitions %d, RocksDB state store"
          % (f["trigger_s"], f["master"], f["partitions"]))
    print("offered: %d reports/s (marks alone until the job's first batch); measured after %.1f s of start-up and "
          "warm-up (the job's first batch, --warmup %g s, then until it applied what was fed %g s before%s)" % (
              f["offered_per_s"], f["warmed_s"], f["warmup_s"], CAUGHT_UP, "" if f["warm_drained"] else
              ": NOT caught up (its lag grew, or %d s passed), measured anyway" % DRAIN_WAIT))
    if f["marks"]:
        print("marks (heartbeats of devices silent %g s) while measured: %d, beside the reports" % (MARK_AFTER, f["marks"]))
    print("sustained: %d reports/s (target >= %d)%s" % (f["sustained_per_s"], TARGET_RATE,
                                                         "" if f["drained"] else " [backlog not drained within 60 s]"))
    print("micro-batches while feeding: %d, records per batch median %d" % (f["batches"], f["batch_median"]))
    print("reading -> published answer latency over %d answer changes: p50 %.3f s, p99 %.3f s (target p99 <= %.1f s)"
          % (f["answers"], f["p50_s"], f["p99_s"], TARGET_P99))
    print("per-batch phases, median ms: %s" % ", ".join("%s %d" % kv for kv in f["phases_ms"].items()))
    print("group hosts: cached in the worker %d group-batches, caught up from the journal %d, rebuilt %d"
          % (f["cache_hits"], f["caught_up"], f["rebuilt"]))
    if f["worker_ms"]:
        print("python worker per batch, median ms: host %.1f, state store %.1f" % tuple(f["worker_ms"]))
    if f["snapshot_bytes"]:
        print("state: snapshot %d bytes for %d sources = %d bytes per source"
              % (f["snapshot_bytes"], f["snapshot_sources"], f["snapshot_bytes"] // max(1, f["snapshot_sources"])))


if __name__ == "__main__":
    sys.exit(main())
