"""`python -m backend.bench.faults --seeds`: adaptive against deadband on the issue's workload, per seed."""
from backend.bench import faults


def test_seeds_table_splits_delivery_traffic_from_the_rest(monkeypatch):
    # a short run of the workload; the table's columns are checked against the run's own counts
    monkeypatch.setattr(faults, "FINAL", dict(faults.FINAL, duration=60))
    text = faults.seeds([7])
    rows = [r.split("|")[1:-1] for r in text.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows] == [
        ("7", "faults", "adaptive"), ("7", "faults", "deadband"), ("7", "skew", "adaptive"), ("7", "skew", "deadband")]
    for r in rows:
        msgs, delivery, others = (int(r[i]) for i in (3, 4, 5))
        assert msgs == delivery + others and msgs > 0
        assert (delivery > 0) == (r[1].strip() == "faults")        # ack mode only on the lossy network
        assert int(r[6]) == 0 and int(r[9]) == 0                    # no violation, no unsaid wide final
    for a, d in ((rows[0], rows[1]), (rows[2], rows[3])):
        diff = d[-1].strip().split(" / ")
        assert int(diff[0]) == int(a[3]) - int(d[3]) and int(diff[1]) == int(a[5]) - int(d[5])
