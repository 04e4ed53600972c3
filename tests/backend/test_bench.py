"""A tiny smoke run of ``quietfleet bench``: the report is written and its ratios are self-consistent."""
import csv

from backend import bench


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
