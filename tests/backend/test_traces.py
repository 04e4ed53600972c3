"""The real-trace suite: converted traces match the datasets' documented sizes, load in the simulator,
and the bench section runs on one short trace with self-consistent figures."""
import csv
import math

import pytest

from backend.bench import traces as bench_traces
from backend.bench import suite as traces
from backend.sim.sources import samples
from backend.sim.workload import load

# (sources, samples) from each dataset's documentation: rows × columns less its missing values.
EXPECTED = {
    "seismic-rjob": (3, 3 * 3000),
    "ppg": (2, 2483 + 15000),
    "weather-nyc": (3, 26115 - 1),          # one hour without a temperature
    "elec-victoria": (1, 365 * 48),
    "nox-switzerland": (13, 366 * 13 - 171),  # 171 site-days without a measurement
    "eu-stocks": (4, 1860 * 4),
    "ozone-grid": (576, 24 * 24 * 72),
    "great-lakes": (4, 92 * 4),
    "djia": (1, 37931),
    "eeg-scalp": (32, 32 * 47),             # 32 electrodes, -190 to 730 ms every 20 ms
    "sea-keywest": (1, 6572),
    "chicago-l": (20, 20 * 5698),           # 20 stations, 5698 days
    "weather-5cities": (5, 5 * 731),        # 5 cities, 2016-2017
    "co2-baseline": (2, 360 + 348),         # Mauna Loa 1988-2017, South Pole 1988-2016
    "airquality-nyc": (4, 153 * 4 - 37 - 7),  # 37 days without ozone, 7 without solar radiation
    "leeds-air": (10, 5550),                # 5 pollutants, summer and winter daily maxima
    "bank-calls": (20, 16224),              # 20 weeks of weekday 5-min counts (holidays short)
    "beaver-temp": (2, 114 + 100),
    "gold-goog": (2, 1108 - 34 + 1000),     # 34 days without a gold price
    "manaus-river": (1, 90 * 12),           # January 1903 to December 1992
    "clemson-temps": (2, 2 * 33148 - 17 - 5),  # 17 days without a low, 5 without a high
    "au-regions": (13, 13 * 112),           # 13 regions, 1910-2021 (no temperatures before 1910)
    "rain-sw-england": (1, 17531),          # 1914-1962, every day
    "spruce-growth": (79, 79 * 13),         # 79 trees measured on the same 13 days
    # the synthetic split (backend/bench/synthetic.py, seeded): sources × readings
    "car-parks": (30, 66579),               # irregular: about 18 readings per park and day
    "rooms": (20, 20 * 30 * 144),
    "wind": (10, 10 * 30 * 144),
    "stocks-30": (30, 30 * 1305),           # trading days in 5 years
    "pm10": (15, 15 * 180 * 24),
}
# Data files of the first two splits: the second held-out set must not reuse any of them.
SEEN = {"obspy/core/data/example.npz", "heartpy/data", "nycflights13/weather", "fpp2/elecdemand",
        "robustbase/ambientNOxCH", "datasets/EuStockMarkets", "plyr/ozone", "DAAG/greatLakes", "stevedata/DJIA"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    return str(d), {c["name"]: c for c in traces.convert(str(d))}


def test_the_suite_spans_domains_intervals_and_a_held_out_set(converted):
    _, cat = converted
    assert set(cat) == set(EXPECTED)
    assert len({c["domain"] for c in cat.values()}) >= 4
    assert min(c["interval_s"] for c in cat.values()) <= 1.0
    assert max(c["interval_s"] for c in cat.values()) >= 86400.0
    assert sum(c["split"] == "held-out" for c in cat.values()) >= 2
    assert all(c["licence"] and c["version"] and c["split"] in traces.SPLITS for c in cat.values())
    assert set(bench_traces.TITLES) == set(traces.SPLITS)


def test_the_second_held_out_set_is_fresh_and_varied(converted):
    _, cat = converted
    fresh = [c for c in cat.values() if c["split"] == "held-out-2"]
    assert len(fresh) >= 4 and len({c["domain"] for c in fresh}) >= 3
    assert all(c["samples"] >= 300 for c in fresh)
    assert min(c["interval_s"] for c in fresh) <= 60.0 and max(c["interval_s"] for c in fresh) >= 28 * 86400.0
    for c in fresh:
        assert not any(seen in c["file"] for seen in SEEN), c["name"]
        assert c["file"] not in {o["file"] for o in cat.values() if o["split"] != "held-out-2"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_converted_trace_counts_order_and_values(converted, name):
    d, cat = converted
    with open("%s/%s.csv" % (d, name), newline="") as fh:
        rd = csv.reader(fh)
        assert next(rd) == ["time", "source", "value"]
        rows = [(float(t), s, float(v)) for t, s, v in rd]
    n_src, n = EXPECTED[name]
    assert len(rows) == n == cat[name]["samples"]
    assert len({s for _, s, _ in rows}) == n_src == cat[name]["sources"]
    assert rows[0][0] == 0.0 and all(a[0] <= b[0] for a, b in zip(rows, rows[1:]))
    assert all(math.isfinite(t) and math.isfinite(v) for t, _, v in rows)
    last = {}
    for t, s, _ in rows:                     # one reading per source and instant
        assert t > last.get(s, -1.0)
        last[s] = t
    assert math.isclose(cat[name]["span_s"], rows[-1][0])
    q = cat[name]["queries"][0]
    assert q["kind"] == "avg" and q["sources"] == "all"
    assert math.isclose(q["precision"], traces.PRECISION_FRACTION * cat[name]["spread"]) and q["precision"] > 0
    w = load(traces.workload(cat[name], d, "deadband"))
    assert len(samples(w)[0]) == n


def test_a_run_over_its_limit_is_reported_not_waited_for(converted):
    d, cat = converted
    assert bench_traces.run_limited(traces.workload(cat["great-lakes"], d, "deadband"), 0) is None


def test_bench_section_smoke(tmp_path):
    lines, viol = bench_traces.section(str(tmp_path), smoke=True, log=lambda s: None)
    assert viol == 0
    text = "\n".join(lines)
    assert "| seismic-rjob | 1503 |" in text and "Held-out" not in text
    (row,) = list(csv.DictReader(open(tmp_path / "traces.csv")))
    db = int(row["deadband"])
    assert float(row["deadband/db"]) == 1.0
    assert 0 < int(row["clairvoyant_pl"]) <= int(row["clairvoyant_pc"]) <= db
    runs = list(csv.DictReader(open(tmp_path / "traces_runs.csv")))
    assert {r["column"] for r in runs} >= {"deadband", "optimal_static", "adaptive", "deadband-mixed", "mixed",
                                           "all-lagged", "max-adaptive", "brownian"}
    assert all(r["status"] == "ok" and int(r["samples"]) == 1503 for r in runs)
    assert [r["status"] for r in runs if r["column"] == "mixed"] == ["ok"] and 0 < float(row["mixed/db"]) <= 1.0
    assert 0 < float(row["brownian fidelity"]) <= 1 and "fidelity" in text and "## Lagged and real-time" in text
    for png in ("traces_ratio.png", "traces_speed.png", "traces_data.png", "traces_mixed.png"):
        assert (tmp_path / png).stat().st_size > 0


def test_geometric_means_per_split():
    rows = [{"split": "held-out-2", "a/db": 4.0}, {"split": "dev", "a/db": 0.5}, {"split": "dev", "a/db": 2.0},
            {"split": "held-out", "a/db": 0.25}, {"split": "held-out-2", "a/db": 0.25}]
    assert [(s, {k: (round(g, 9), n) for k, (g, n) in got.items()}) for s, got in bench_traces.geomeans(rows)] == [
        ("dev", {"a/db": (1.0, 2)}), ("held-out", {"a/db": (0.25, 1)}), ("held-out-2", {"a/db": (1.0, 2)})]


def test_a_table_per_split_in_split_order():
    rows = [{"trace": n, "split": s, "span": "1 d", "interval": "1 h", "sources": 1, "samples": 10, "db": 5,
             "db/db": 1.0, "db samples/s": 100} for n, s in (("c", "held-out-2"), ("a", "dev"), ("d", "held-out-2"))]
    text = "\n".join(bench_traces.split_tables(rows, ["db"], ["db"]))
    assert text.index("### Development traces") < text.index("| a | 10 |") < text.index(
        "### Held-out traces, second set (added 2026-11-24, never tuned on)") < text.index("| c | 10 |") < text.index(
        "| d | 10 |")
    assert "| c | 10 | 1 d | 1 h | 1 | 5 (1.000) | 100 |" in text and "(never tuned on)\n" not in text


def test_the_mixed_columns_read_the_most_variable_third_and_compare_with_their_own_baseline(converted):
    d, cat = converted
    from backend.bench import mixed
    c = cat["weather-nyc"]
    picked = mixed.extremes(c, d)
    rows = list(csv.reader(open("%s/weather-nyc.csv" % d)))[1:]
    step = {}
    for s in {r[1] for r in rows}:
        v = [float(r[2]) for r in rows if r[1] == s]
        step[s] = sum(abs(b - a) for a, b in zip(v, v[1:])) / (len(v) - 1)
    assert picked == [max(step, key=step.get)]          # ⌈3/3⌉ = 1 source, the one that moves most
    avg, top = mixed.queries(10)(c, d)
    assert avg["lag"] == 10 * c["interval_s"] and "lag" not in top and top["precision"] == avg["precision"]
    cols = [col for col in bench_traces.COLUMNS if col["label"] in ("deadband-mixed", "mixed")]
    rows, _ = bench_traces.measure([cat["great-lakes"]], d, 60, columns=cols, log=lambda s: None)
    assert rows[0]["mixed/db"] == round(rows[0]["mixed"] / rows[0]["deadband-mixed"], 4) < 1.0


def test_extra_columns_hook_changes_the_query(converted):
    """A column's ``query`` hook reaches the simulator: twice the precision sends fewer messages."""
    d, cat = converted
    cols = bench_traces.COLUMNS[:1] + [{"label": "deadband-2x", "protocol": "deadband",
                                        "query": lambda c: {"precision": 2 * c["queries"][0]["precision"]}}]
    rows, runs = bench_traces.measure([cat["seismic-rjob"]], d, 60, duration=5.0, columns=cols, log=lambda s: None)
    assert [r["column"] for r in runs] == ["deadband", "deadband-2x"]
    assert 0 < rows[0]["deadband-2x"] < rows[0]["deadband"]


@pytest.mark.parametrize("split", ["held-out-3", "held-out-4"])
def test_the_later_held_out_sets_are_fresh_and_varied(converted, split):
    _, cat = converted
    fresh = [c for c in cat.values() if c["split"] == split]
    assert len(fresh) >= 4 and len({c["domain"] for c in fresh}) >= 3
    assert all(c["samples"] >= 200 for c in fresh)
    for c in fresh:
        assert not any(seen in c["file"] for seen in SEEN), c["name"]
        assert c["file"] not in {o["file"] for o in cat.values() if o["split"] != split}
