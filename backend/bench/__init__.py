"""Product-wide benchmarks (DESIGN.md §8): figures measured across the product, not timed tests.

``report`` (``quietfleet bench``: messages per protocol, limits, violations, throughput and the report),
``births`` (a fleet booting into an ``"all"`` query), ``edge`` (edge cost per sample and heap per agent
kind), ``faults`` (the bench workloads on a hostile network), ``traces`` (the real-trace section and
``scripts/traces.py``), ``suite`` (the real-trace suite and its converters), ``synthetic`` (seeded
synthetic traces no workload generator makes). Each with a command line runs as ``python -m backend.bench.NAME``.

The rule for Spark: benchmarks that need a Spark session and measure only the Spark job
(``bench_job``, ``bench_ingest``, ``bench_disk``) stay beside the job in ``backend/spark/``;
``report`` calls them from there.
"""
