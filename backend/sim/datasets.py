"""Real sensor traces shipped with a pinned package, for workloads that need real rather than synthetic data.

``temps``: hourly air temperatures (°F) of Seattle and San Francisco for 2010 from the
vega-datasets package, cut into month-long series aligned on the hour of the month, so 24 real
sensors (``sea-01`` … ``sf-12``) report once an hour (time unit: hours).
"""
import csv
import importlib.resources

DATASETS = ("temps",)


def _hourly(name):
    text = (importlib.resources.files("vega_datasets") / "_data" / name).read_text()
    rows = list(csv.DictReader(text.splitlines()))
    return [(r["date"], float(r["temp"])) for r in rows]


def load_dataset(name):
    """(times, source names, values) in time order for dataset ``name``."""
    if name != "temps":
        raise ValueError("unknown dataset %r; have %s" % (name, ", ".join(DATASETS)))
    series = {}
    for city, fname in (("sea", "seattle-temps.csv"), ("sf", "sf-temps.csv")):
        for date, temp in _hourly(fname):
            month, day, hour = int(date[5:7]), int(date[8:10]), int(date[11:13])
            series.setdefault("%s-%02d" % (city, month), []).append(((day - 1) * 24 + hour, temp))
    rows = sorted((t, src, v) for src, pts in series.items() for t, v in pts)
    return [float(r[0]) for r in rows], [r[1] for r in rows], [r[2] for r in rows]
