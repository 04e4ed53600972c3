"""Seeded synthetic traces for ``quietfleet bench`` that no workload generator makes (DESIGN.md §8).

Each writes ``time,source,value`` rows to a CSV in ``folder`` (once per set of arguments) and returns its
path: random walks whose step sizes change during the run (Olston et al. 2003 §3.3: where an adaptive
allocation should beat every static one), 10-minute temperatures in 0.1° over months (slow, quantised
signals with daily cycles), daily random walks over years (a long time span with few samples), and car-park
occupancy read about every 30 min in daytime only (irregular, integer, 15 h overnight gaps).
"""
import math
import os

import numpy as np


def _write(path, times, names, values, fmt):
    tmp = path + ".part"
    with open(tmp, "w") as fh:
        fh.write("time,source,value\n")
        for k, t in enumerate(times):
            for i, name in enumerate(names):
                fh.write(("%g,%s," + fmt + "\n") % (t, name, values[i][k]))
    os.replace(tmp, path)
    return path


def changing_rates(folder, n, duration, seed):
    """n Gaussian walks sampled once per time unit, step sizes U[0.25, 8] reshuffled at 1/3 and 2/3 of the run."""
    path = os.path.join(folder, "changing-rates-%d-%d-%d.csv" % (n, duration, seed))
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    steps = rng.uniform(0.25, 8.0, n)
    d = rng.normal(0.0, 1.0, (duration, n))
    for k, cut in enumerate(np.array_split(np.arange(duration), 3)):
        d[cut] *= steps if k == 0 else rng.permutation(steps)
    d[0] = 0.0
    v = rng.uniform(90, 110, n) + np.cumsum(d, axis=0)
    return _write(path, np.arange(duration, dtype=float), ["s%d" % i for i in range(n)], v.T, "%.6f")


def slow_temperatures(folder, n, days, seed):
    """n sensors every 600 s for ``days``, in 0.1°: seasonal drift, a daily cycle and weather."""
    path = os.path.join(folder, "slow-temperatures-%d-%d-%d.csv" % (n, days, seed))
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * 86400, 600.0)
    rows = []
    for _ in range(n):
        wx = np.cumsum(rng.normal(0, 0.05, t.size))
        wx -= np.convolve(wx, np.ones(144) / 144, mode="same")
        rows.append(np.round(15 + 5 * rng.random() + 4 * np.sin(2 * math.pi * t / (365 * 86400) + rng.random())
                             + (3 + 4 * rng.random()) * np.sin(2 * math.pi * t / 86400 + 6.3 * rng.random())
                             + wx + rng.normal(0, 0.05, t.size), 1))
    return _write(path, t, ["t%d" % i for i in range(n)], rows, "%.1f")


def occupancy(folder, n, days, seed):
    """n car parks' occupancy counts (whole cars), read about every 30 min from 08:00 to 16:30 with a few
    minutes of jitter and the odd missed reading, nothing overnight (15 h gaps): capacities 200–4000,
    a morning rise and afternoon fall that differ by car park and by day, quieter weekends."""
    path = os.path.join(folder, "occupancy-%d-%d-%d.csv" % (n, days, seed))
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    cap = np.exp(rng.uniform(math.log(200), math.log(4000), n))
    peak = rng.uniform(0.3, 0.95, n)            # usual midday fill
    rise = rng.uniform(1.0, 3.0, n)             # hours to fill up after 08:00
    rows = []
    for d in range(days):
        day = rng.normal(1.0, 0.08, n) * (0.45 if d % 7 >= 5 else 1.0)
        for k in range(18):
            for i in range(n):
                if rng.random() < 0.03:
                    continue                        # a missed reading
                h = 0.5 * k + rng.normal(0, 0.06)   # hours after 08:00 (a few minutes of jitter)
                fill = peak[i] * day[i] * (1 - math.exp(-max(h, 0) / rise[i])) * (1 - 0.25 * max(0.0, h - 5) / 3.5)
                v = min(cap[i], max(0.0, round(cap[i] * fill + rng.normal(0, 0.004 * cap[i]))))
                rows.append((d * 86400.0 + 8 * 3600.0 + h * 3600.0, i, v))
    rows.sort()
    tmp = path + ".part"
    with open(tmp, "w") as fh:
        fh.write("time,source,value\n")
        for t, i, v in rows:
            fh.write("%.0f,p%02d,%d\n" % (t, i, v))
    os.replace(tmp, path)
    return path


def daily_walks(folder, n, years, seed):
    """n daily values (cents) over ``years``: walks with step sizes U[0.2, 2]."""
    path = os.path.join(folder, "daily-walks-%d-%d-%d.csv" % (n, years, seed))
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    t = np.arange(years * 365) * 86400.0
    rows = [np.round(100 + np.cumsum(rng.normal(0, rng.uniform(0.2, 2.0), t.size)), 2) for _ in range(n)]
    return _write(path, t, ["p%d" % i for i in range(n)], rows, "%.2f")



# -- seeded stand-ins for the kinds of fleets users run (the trace suite's ``synthetic`` split): each returns
# {source: (times in s, values)}, like the suite's readers of public recordings

def car_parks(n=30, days=120, seed=41):
    """Occupancy (whole cars) of n car parks: readings about every 30 min (±20 %) from about 8:00 to 17:00 and
    none overnight (15 h gaps), a daytime bump to a per-park peak, quieter weekends, noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        cap, peak, noise, ts, vs = int(rng.integers(80, 600)), rng.uniform(0.5, 0.95), 0.0, [], []
        for d in range(days):
            day = peak * (1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.4)[d % 7] * rng.normal(1.0, 0.08)
            t, close = (d + rng.uniform(7.5, 8.5) / 24) * 86400.0, (d + rng.uniform(16.5, 17.5) / 24) * 86400.0
            while t < close:
                bump = max(0.0, math.sin(math.pi * ((t / 3600.0) % 24 - 7.0) / 11.0)) ** 1.5
                noise = 0.8 * noise + rng.normal(0.0, 0.02)
                ts.append(round(t, 1))
                vs.append(float(int(min(cap, max(0.0, cap * (0.05 + day * bump + noise))))))
                t += 1800.0 * rng.uniform(0.8, 1.2)
        out["park%02d" % i] = (np.asarray(ts), np.asarray(vs))
    return out


def indoor_temperatures(n=20, days=60, seed=42):
    """Room temperatures (0.1 °C) of n rooms every 10 min: heating on working days, a per-room daily swing, drift."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * 86400, 600.0)
    h, day = (t / 3600.0) % 24, (t // 86400) % 7
    on = ((h > 7) & (h < 18) & (day < 5)).astype(float)
    out = {}
    for i in range(n):
        heat = np.convolve(on, np.ones(12) / 12, mode="same") * rng.uniform(1.5, 4.0)
        drift = np.cumsum(rng.normal(0, 0.03, t.size))
        drift -= np.convolve(drift, np.ones(432) / 432, mode="same")
        v = 18 + 2 * rng.random() + heat + rng.uniform(0.3, 1.2) * np.sin(2 * math.pi * (h - 15) / 24) + drift
        out["room%02d" % i] = (t, np.round(v + rng.normal(0, 0.05, t.size), 1))
    return out


def wind(n=10, days=30, seed=43):
    """Wind speed (0.1 m/s) at n stations every 10 min: a shared weather pattern, diurnal swing, gusty noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * 86400, 600.0)
    common = np.zeros(t.size)
    for k in range(1, t.size):
        common[k] = 0.995 * common[k - 1] + rng.normal(0, 0.06)
    out = {}
    for i in range(n):
        own = np.zeros(t.size)
        e = rng.normal(0, 0.08, t.size)
        for k in range(1, t.size):
            own[k] = 0.97 * own[k - 1] + e[k]
        base = rng.uniform(1.0, 2.0) + common + own + 0.3 * np.sin(2 * math.pi * ((t / 3600.0) % 24 - 9) / 24)
        out["wind%02d" % i] = (t, np.round(np.exp(base) * rng.gamma(20, 0.05, t.size), 1))
    return out


def stocks(n=30, years=5, seed=44):
    """Daily closing prices (cents) of n stocks on trading days: geometric walks with a shared market factor."""
    rng = np.random.default_rng(seed)
    days = np.arange(int(years * 365.25))
    t = days[days % 7 < 5] * 86400.0
    market = rng.normal(0.0002, 0.01, t.size)
    out = {}
    for i in range(n):
        r = rng.uniform(0.5, 1.5) * market + rng.normal(0, rng.uniform(0.008, 0.025), t.size)
        out["stk%02d" % i] = (t, np.round(rng.uniform(10, 300) * np.exp(np.cumsum(r)), 2))
    return out


def pm10(n=15, days=365, seed=45):
    """Hourly PM10 (whole µg/m³) at n stations: a shared regional log-level, local episodes, traffic hours."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * 86400, 3600.0)
    h = (t / 3600.0) % 24
    region = np.zeros(t.size)
    for k in range(1, t.size):
        region[k] = 0.98 * region[k - 1] + rng.normal(0, 0.08)
    out = {}
    for i in range(n):
        own = np.zeros(t.size)
        e = rng.normal(0, 0.15, t.size)
        for k in range(1, t.size):
            own[k] = 0.9 * own[k - 1] + e[k]
        rush = 0.25 * (np.exp(-((h - 8) / 1.5) ** 2) + np.exp(-((h - 18) / 2) ** 2))
        out["pm%02d" % i] = (t, np.round(np.exp(rng.uniform(2.8, 3.4) + region + own + rush)))
    return out
