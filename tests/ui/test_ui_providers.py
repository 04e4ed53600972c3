"""The drivers' totals providers (backend/ui/providers.py) on stand-ins for their drivers."""
from types import SimpleNamespace

from backend.host import Host
from backend.ui.providers import BackendTotals, CoordinatorTotals, DemoTotals


def test_demo_totals_count_from_installed_filters():
    class Dev:
        def __init__(self, rows):
            self.rows = rows

        def readings(self):
            return self.rows

    rows = [(t / 10, "t0", 20.0 + (0.3 if t % 20 >= 10 else 0.0)) for t in range(100)]
    observer = SimpleNamespace(counts={"up": 3, "ctl": 1})
    clock = [0.0]
    p = DemoTotals(observer, [Dev(rows)], clock=lambda: clock[0])
    assert "samples" not in p() and "window" in p()          # filters not installed yet: no figures
    p.start(5.0, [{"id": "q", "kind": "avg", "sources": ["t0"], "precision": 0.4}])
    out = p()
    assert out["samples"] == 50 and out["ours"] == 4
    assert out["deadband"] == 5                 # a 0.4 band (±0.2): each 0.3 step from 5.0 s on is reported
    observer.counts = {"up": 9, "ctl": 1}
    assert p()["ours"] == 4                     # cached for ``every`` seconds
    clock[0] = 10.0
    assert p()["ours"] == 10


def test_coordinator_and_backend_totals():
    host = Host(protocol="adaptive")
    live = SimpleNamespace(host=host, stats={"uplinks": 5, "downlinks": 2, "answers": 1})
    out = CoordinatorTotals(live)()
    assert "adaptive" in out["driver"] and out["extra"]["uplinks received"] == 5
    assert "deadband" not in out                # no report yet: no estimate
    host.coord.protocol.static, host.coord.protocol.spent = 40.0, 10.0
    out = CoordinatorTotals(live)()
    assert out["deadband"] == 40.0 and out["ours"] == 10.0
    deadband = CoordinatorTotals(SimpleNamespace(host=Host(protocol="deadband"), stats=live.stats))()
    assert "deadband" not in deadband
    svc = SimpleNamespace(settings={"protocol": "deadband"}, status=lambda: {
        "batch": 7, "groups": {"f": {"records": 100, "stats": {"late": 2}}, "g/1": {"records": 5, "stats": {}}}})
    out = BackendTotals(svc)()
    assert out["extra"] == {"batch": 7, "records applied": 105, "groups": 2, "late reports": 2}
    assert BackendTotals(SimpleNamespace(settings={}, status=lambda: None))()["extra"]["records applied"] == 0


def test_security_counters_reach_the_dashboard_from_both_drivers():
    """A refused birth and bad messages, as the live coordinator counts them and as a Spark group's digest
    carries them, in the totals' ``security`` and as rows the page shows; the state model passes them on."""
    from backend.host import digest
    from backend.ui.state import DashboardState
    from edge.agent import Agent
    host = Host(protocol="deadband")
    host.coord.admission.owners, host.coord.admission.provisioned = {"t1": "dev1"}, frozenset({"dev1"})
    host.uplink(1.0, "evil", Agent("evil", ["t1"], boot=1).start(1.0)[0][1])
    for _ in range(3):
        host.uplink(1.5, "evil", b"\x07")
    live = SimpleNamespace(host=host, stats={"uplinks": 4, "downlinks": 0, "answers": 0})
    out = CoordinatorTotals(live)()
    assert out["security"]["refused"] == 1 and out["security"]["bad_messages"] == 3
    assert out["security"]["offenders"] == {"evil": {"refused": 1, "bad_messages": 3}}
    assert out["extra"]["refused sources"] == 1 and out["extra"]["offending devices"] == "evil"
    svc = SimpleNamespace(settings={"protocol": "deadband"}, status=lambda: {
        "batch": 1, "groups": {"f": dict(digest(host, False, False), records=5)}})
    spark = BackendTotals(svc)()
    assert spark["security"] == out["security"] and spark["extra"]["bad messages"] == 3
    assert DashboardState("f").totals(out)["security"]["refused"] == 1
