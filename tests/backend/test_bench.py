"""A tiny smoke run of ``quietfleet bench``: the report is written and its ratios are self-consistent."""
import csv

from backend.bench import report as bench


def test_bench_smoke(tmp_path):
    assert bench.main(str(tmp_path), smoke=True, log=lambda s: None) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert "Guarantee violations across every run below: **0**" in report
    assert (tmp_path / "messages.png").stat().st_size > 0 and (tmp_path / "throughput.png").stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "protocols.csv")))
    for r in rows:
        if r["protocol"] == "naive":
            assert float(r["vs_naive"]) == 1.0
        if r["protocol"] == "deadband":
            assert float(r["vs_deadband"]) == 1.0 and float(r["vs_naive"]) < 1.0
    for r in csv.DictReader(open(tmp_path / "clairvoyant.csv")):
        assert int(r["reports"]) >= int(r["clairvoyant_min"]) > 0


def test_births_bench_costs_each_newborn_its_own_messages():
    # backend.bench.births: a birth into an "all" AVG costs its device a setup, width ∞ (before the query
    # takes it in) and its width; unacknowledged, a narrowing may be sent once more, never anyone else's
    from backend.bench import births as bench_births
    for protocol in ("deadband", "adaptive"):
        assert bench_births.run(protocol, 60, 0.1, 1)[0] == 3 * 60
        for lag in (10, 0):
            assert 3 * 60 <= bench_births.run(protocol, 60, 0.1, lag)[0] <= 4 * 60
