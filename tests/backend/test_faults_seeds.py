"""`python -m backend.bench.faults --seeds`: adaptive against deadband on the issue's workload, per seed."""
from backend.bench import faults
from backend.sim.workload import load


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
        assert int(r[6]) == int(r[7]) == int(r[10]) == int(r[13]) == 0   # no violation (final or not), no unsaid wide final, none late
    for a, d in ((rows[0], rows[1]), (rows[2], rows[3])):
        diff = d[-1].strip().split(" / ")
        assert int(diff[0]) == int(a[3]) - int(d[3]) and int(diff[1]) == int(a[5]) - int(d[5])
        # adaptive's exact no-regret ledger (its exactness: test_regret), within its loan; deadband has none
        gap, loan = a[-2].strip().replace("(loan ", "").rstrip(")").split()
        assert int(gap) <= int(loan) and int(loan) >= 20 and d[-2].strip() == ""


def test_a_partitioned_devices_resends_are_not_messages():
    # every device cut off from 20 s to 40 s: each resends its unacknowledged report into the partition, which
    # drops them; the delivery column counts only the resends that reached the network (before, the devices' own
    # count: more than all the run's messages on the partitions network). Oracle: without loss or partition every
    # resend reaches it.
    spec = dict(faults.FINAL, duration=60)
    cut = faults.run("p", spec, "deadband", dict(faults.FAULTS, loss=0.0, partitions=[[20.0, 40.0, "all"]]))
    assert cut["network"]["partitioned"] > 0 and 0 < cut["resent_sent"] < cut["resent"]
    assert cut["by_kind"]["ack"] + cut["by_kind"].get("nack", 0) + cut["resent_sent"] <= \
        cut["messages"]["up"] + cut["messages"]["down"]
    clean = faults.run("c", spec, "deadband", dict(faults.FAULTS, loss=0.0))
    assert clean["resent"] > 0 and clean["resent_sent"] == clean["resent"]


def test_the_networks_of_the_seeds_table():
    # each shape is a network the workload accepts (its partitions name its devices), drawn from the seed
    for name, make in faults.SHAPES.items():
        net, extra = make(4001)
        assert net == faults.SHAPES[name](4001)[0]
        w = load(dict(faults.FINAL, protocol="adaptive", network=dict(faults.FINAL["network"], **net),
                      sources=dict(faults.FINAL["sources"], **extra)))
        assert w.faults and (name != "outages" or w.sources.get("outages"))
    cut = faults.SHAPES["partitions"](4001)[0]["partitions"]
    assert cut != faults.SHAPES["partitions"](4002)[0]["partitions"] and cut[-1][2] == "all"
    assert all(0 < a < b <= faults.FINAL["duration"] for a, b, _ in cut)
