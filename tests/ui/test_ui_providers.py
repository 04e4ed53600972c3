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
