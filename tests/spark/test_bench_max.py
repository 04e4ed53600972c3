"""The maximum-sustained search of ``backend.spark.bench_max`` against a brute-force oracle of synthetic capacities."""
from backend.spark import bench_max


def fake(capacity, feeder=10 ** 9):
    """A ``measure`` stand-in: keeps up at or below ``capacity``; the feeder offers at most ``feeder``/s."""
    def run(rate):
        over = rate > capacity
        return {"offered_per_s": min(rate, feeder), "drained": not over, "max_offsets": 2 * rate,
                "lag_growth": 3 * rate if over else rate}
    return run


def test_search_finds_the_largest_passing_rate_it_tried():
    for capacity in (500, 1999, 2000, 2001, 4700, 7000, 12345, 30000, 127999, 10 ** 6):
        for refine in (0, 1, 2, 3):
            best, steps, bound = bench_max.search(fake(capacity), 2000, refine, 128000)
            tried = [r for r, _ in steps]
            passing = [r for r in tried if r <= capacity]
            assert not bound
            assert best == max(passing, default=0)                  # oracle: the brute-force maximum of the tried
            assert all(r > best for r in tried if r > capacity)
            assert len(set(tried)) == len(tried)
            failing = [r for r in tried if r > capacity]
            if failing:     # each bisection halves the bracket the doubling found
                first = tried.index(failing[0])
                width = failing[0] - max([r for r in tried[:first]], default=0)
                assert min(failing) - best <= width / 2 ** refine + 1
            if capacity >= 128000:
                assert best == 128000


def test_kept_up_is_bounded_growth_and_drained():
    assert bench_max.kept_up({"drained": True, "lag_growth": 4000, "max_offsets": 4000})
    assert not bench_max.kept_up({"drained": True, "lag_growth": 4001, "max_offsets": 4000})
    assert not bench_max.kept_up({"drained": False, "lag_growth": 0, "max_offsets": 4000})


def test_a_feeder_that_cannot_offer_the_rate_stops_the_search():
    best, steps, bound = bench_max.search(fake(10 ** 6, feeder=20000), 2000, 2, 128000)
    assert bound and best == 16000 and steps[-1][0] == 32000


def test_a_drain_applies_the_filled_topic_in_bounded_batches_job_and_floor_alike(kafka_broker, job_spark):
    """``--drain``: the job and the no-op floor each read every record of a topic filled before they start, in
    batches of at most ``batch`` records (Spark's ``maxOffsetsPerTrigger``), and the rate is the records of
    the timed batches (after ``SKIP``) over their time; the job's worker reports its host time per record."""
    got = {}
    for floor in (False, True):
        f = got[floor] = bench_max.drain(floor, devices=50, records=3000, rate=1000, batch=500,
                                         kafka=kafka_broker, spark=job_spark)
        assert f["total"] == 50 + 5 + 3000            # births, one sum query per 10 sources, the reports
        assert sum(f["sizes"]) == f["total"] and max(f["sizes"]) <= 500
        assert f["records"] == sum(f["sizes"][bench_max.SKIP + 1:]) and f["batches"] == len(f["sizes"]) - bench_max.SKIP - 1
        assert f["rate"] == f["records"] / f["seconds"] > 0
    assert got[False]["host_cpu_us"] > 0 and got[True]["host_cpu_us"] == 0     # (the floor runs no Host)
    assert got[False]["total"] == got[True]["total"]
