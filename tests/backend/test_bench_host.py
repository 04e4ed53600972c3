"""``backend.bench.host``: the Spark bench's workload through ``job.run_batch`` gives what a plain ``Host`` fed the
same records one at a time gives (the oracle), whatever the batch size, and the same hash run after run."""
from backend import host
from backend.bench import host as bench
from backend.spark.bench_job import births


def test_the_replay_is_a_plain_hosts_answers_whatever_the_batching():
    t0 = 1.7e9
    oracle = host.Host(host.settings(protocol="naive", period=10.0, latency=0.0))
    answers = 0
    for r in bench.as_records(births(40, t0)):
        oracle.record(*r)
    for r in bench.as_records(bench.reports(40, 200, 600, t0)):
        answers += sum(a[0] == "answer" for a in oracle.record(*r))
    assert answers > 600                # (λ 0: each report moves its query's answer and its final answer)
    runs = [bench.run(devices=40, rate=200, seconds=3.0, batch_s=b) for b in (0.5, 0.5, 0.05)]
    assert [r[1] for r in runs] == [answers] * 3
    assert runs[0][2] == runs[1][2]     # the outputs' hash: bit-identical run after run
    assert all(r[0] > 0 for r in runs)
