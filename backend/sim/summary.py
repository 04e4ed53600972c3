"""Summary-query simulator for SWAT-ASR and its baselines (Bulut & Singh 2003 §5 setup).

One device streams readings every ``data.interval`` seconds into a SWAT tree; client sites ask
one-time summary queries (kind "summary", type point | range | inner) at a query arrival rate;
phases end every ``phase`` seconds. Every answer carries its error estimate (a guaranteed interval)
and is checked against the exact window. Workload dict keys::

    {"window": 32, "protocol": "swat-asr" | "dc" | "aps", "clients": 1, "phase": 10,
     "duration": 1000, "seed": 0,
     "data": {"generator": "weather" | "uniform" | "random_walk", "interval": 2.0},
     "queries": [{"id": "q", "kind": "summary", "type": "inner", "weights": "linear",
                  "window": "random" | [first, last], "rate": 1.0, "precision": 2.0}],
     "params": {...protocol constructor keywords...}}

``precision`` is the tolerated error per unit of weight: a query with weights W must be answered
within delta = precision * sum|W| (a point query within ``precision``); ``rate`` is queries per second
per client; "range" queries also take ``value`` (default: the window mean) and ``radius``.
"""
import math
import random

from backend.coordinator.swat.asr import SYSTEMS, weights_for

TYPES = ("point", "range", "inner")
WEIGHTS = ("linear", "exponential", "uniform")
GENERATORS = ("weather", "uniform", "random_walk")


class SummaryError(ValueError):
    """A summary workload that cannot be run; the message names the key at fault."""


def stream(generator, n, seed):
    """``n`` readings. "weather": a daily-maximum-temperature stand-in (seasonal cycle + AR(1)
    noise, °F) for the paper's Santa Barbara trace, which is not available here; "uniform": the
    paper's synthetic U[0, 100]; "random_walk": unit steps."""
    rng = random.Random(seed)
    out = []
    if generator == "weather":
        e = 0.0
        for t in range(n):
            e = 0.7 * e + rng.gauss(0.0, 3.0)
            out.append(round(68.0 + 8.0 * math.sin(2 * math.pi * t / 365.25) + e, 1))
    elif generator == "uniform":
        out = [rng.uniform(0.0, 100.0) for _ in range(n)]
    else:
        v = 50.0
        for _ in range(n):
            v += rng.choice((-1.0, 1.0))
            out.append(v)
    return out


def _num(d, key, default, where, positive=False):
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise SummaryError("%s.%s must be a %s number, got %r" % (where, key, "positive" if positive else "non-negative", v))
    return float(v)


def validate(w):
    """Check a summary workload and fill defaults; returns a new dict."""
    if not isinstance(w, dict):
        raise SummaryError("a summary workload must be an object")
    out = dict(w)
    win = w.get("window", 32)
    if not isinstance(win, int) or isinstance(win, bool) or win < 4 or win & (win - 1):
        raise SummaryError("window must be a power of two >= 4, got %r" % (win,))
    proto = w.get("protocol", "swat-asr")
    if proto not in SYSTEMS:
        raise SummaryError("protocol must be one of %s, got %r" % (", ".join(sorted(SYSTEMS)), proto))
    clients = w.get("clients", 1)
    if not isinstance(clients, int) or isinstance(clients, bool) or not 1 <= clients <= 254:
        raise SummaryError("clients must be an integer in 1..254")
    out["duration"] = _num(w, "duration", None if "duration" not in w else w["duration"], "workload", True) \
        if "duration" in w else None
    if out["duration"] is None:
        raise SummaryError("duration (simulated seconds) is required")
    out["phase"] = _num(w, "phase", 10.0, "workload", True)
    seed = w.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise SummaryError("seed must be a non-negative integer")
    data = w.get("data", {})
    if not isinstance(data, dict) or data.get("generator", "weather") not in GENERATORS:
        raise SummaryError("data.generator must be one of %s" % ", ".join(GENERATORS))
    _num(data, "interval", 1.0, "data", True)
    qs = w.get("queries")
    if not isinstance(qs, list) or not qs:
        raise SummaryError("queries must be a non-empty list")
    for q in qs:
        if not isinstance(q, dict) or q.get("kind") != "summary":
            raise SummaryError("every query needs kind \"summary\", got %r" % (q,))
        if q.get("type", "inner") not in TYPES:
            raise SummaryError("query %s: type must be one of %s" % (q.get("id"), ", ".join(TYPES)))
        if q.get("weights", "linear") not in WEIGHTS:
            raise SummaryError("query %s: weights must be one of %s" % (q.get("id"), ", ".join(WEIGHTS)))
        qw = q.get("window", "random")
        if qw != "random" and not (isinstance(qw, list) and len(qw) == 2 and all(isinstance(x, int) for x in qw)
                                   and 0 <= qw[0] <= qw[1] < win):
            raise SummaryError("query %s: window must be \"random\" or [first, last] within 0..%d" % (q.get("id"), win - 1))
        _num(q, "rate", 1.0, "query", True)
        _num(q, "precision", 1.0, "query")
        _num(q, "radius", 1.0, "query")
        client = q.get("client", "all")
        if client != "all" and (not isinstance(client, int) or not 1 <= client <= clients):
            raise SummaryError("query %s: client must be \"all\" or 1..%d" % (q.get("id"), clients))
    params = w.get("params", {})
    if not isinstance(params, dict):
        raise SummaryError("params must be an object")
    return out


def run(workload):
    """Run one summary workload; returns messages, answer quality and guarantee checks."""
    w = validate(workload)
    win = w["window"]
    clients = w.get("clients", 1)
    data = w.get("data", {})
    td = float(data.get("interval", 1.0))
    duration = w["duration"]
    seed = w.get("seed", 0)
    params = dict(w.get("params", {}))
    system = SYSTEMS[w.get("protocol", "swat-asr")](win, sites=clients + 1, **params)
    values = stream(data.get("generator", "weather"), int(duration / td) + 2, seed)
    rng = random.Random(seed + 7)
    events = []                                        # (time, order, what, payload)
    for j in range(int(duration / td) + 1):
        events.append((j * td, 0, "data", values[j]))
    for q in w["queries"]:
        rate = float(q.get("rate", 1.0))
        targets = range(1, clients + 1) if q.get("client", "all") == "all" else [q["client"]]
        for c in targets:
            t = rng.uniform(0, 1.0 / rate)
            while t <= duration:
                events.append((t, 1, "query", (c, q)))
                t += 1.0 / rate
    phase = w["phase"]
    for j in range(1, int(duration / phase) + 1):
        events.append((j * phase, 2, "phase", None))
    events.sort(key=lambda e: (e[0], e[1]))
    warm = w.get("warmup", 2 * win * td)
    window = []
    stats = {"queries": 0, "answered": 0, "local": 0, "violations": 0, "rel_err": 0.0, "abs_err": 0.0,
             "bound": 0.0, "precision_misses": 0, "range_sure": 0, "range_maybe": 0, "range_exact": 0}
    msgs0 = up0 = None
    for t, _, what, payload in events:
        if msgs0 is None and t >= warm:
            msgs0, up0 = system.msgs, system.uplink
        if what == "data":
            window.insert(0, payload)
            if len(window) > win:
                window.pop()
            system.on_data(t, payload)
        elif what == "phase":
            system.on_phase(t)
        else:
            c, q = payload
            if len(window) < win:
                continue
            qw = q.get("window", "random")
            if qw == "random":
                a = rng.randrange(win)
                b = rng.randrange(a, win)
            else:
                a, b = qw
            kind = q.get("type", "inner")
            positions = list(range(a, b + 1)) if kind != "point" else [a]
            ws = weights_for(q.get("weights", "linear"), len(positions)) if kind == "inner" else [1.0] * len(positions)
            prec = float(q.get("precision", 1.0)) * sum(abs(x) for x in ws)
            if kind == "range":
                # a range query needs each reading within radius: ask for every one at that precision
                ans = [system.on_query(t, c, [i], [1.0], prec) for i in positions]
                if t < warm or None in ans:
                    continue
                p, r = float(q.get("value", 0.0)) or sum(window) / len(window), float(q.get("radius", 1.0))
                exact = [i for i in positions if p - r <= window[i] <= p + r]
                sure = [i for i, x in zip(positions, ans) if p - r <= x["lo"] and x["hi"] <= p + r]
                maybe = [i for i, x in zip(positions, ans) if x["lo"] <= p + r and x["hi"] >= p - r]
                stats["queries"] += 1
                stats["answered"] += 1
                stats["local"] += all(x["local"] for x in ans)
                stats["violations"] += (not set(sure) <= set(exact)) + (not set(exact) <= set(maybe))
                stats["range_sure"] += len(sure)
                stats["range_maybe"] += len(maybe)
                stats["range_exact"] += len(exact)
                continue
            ans = system.on_query(t, c, positions, ws, prec)
            if t < warm:
                continue
            stats["queries"] += 1
            if ans is None:
                continue
            exact = sum(wt * window[i] for i, wt in zip(positions, ws))
            stats["answered"] += 1
            stats["local"] += ans["local"]
            if not ans["lo"] - 1e-6 * (1 + abs(exact)) <= exact <= ans["hi"] + 1e-6 * (1 + abs(exact)):
                stats["violations"] += 1
            err = abs(ans["estimate"] - exact)
            stats["abs_err"] += err
            stats["rel_err"] += err / abs(exact) if exact else 0.0
            stats["bound"] += ans["hi"] - ans["lo"]
            stats["precision_misses"] += (ans["hi"] - ans["lo"]) > prec + 1e-9
    n = max(stats["answered"], 1)
    return {"protocol": w.get("protocol", "swat-asr"), "window": win, "clients": clients,
            "messages": system.msgs - (msgs0 or 0), "uplink_messages": system.uplink - (up0 or 0),
            "bytes_up": getattr(system, "bytes_up", None),
            "queries": stats["queries"], "answered_locally": stats["local"] / n,
            "violations": stats["violations"], "precision_misses": stats["precision_misses"],
            "mean_rel_error": stats["rel_err"] / n, "mean_abs_error": stats["abs_err"] / n,
            "mean_bound_width": stats["bound"] / n,
            "cached_approximations": system.cached() if hasattr(system, "cached") else None}
