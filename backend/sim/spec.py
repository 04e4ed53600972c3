"""The simulator's workload vocabulary (DESIGN.md §5): ``WorkloadError`` and the helpers every loader validates with.

``number``, ``integer``, ``pair`` and ``keys`` check one value or object and raise ``WorkloadError``
naming the key at fault (``network.los``, ``sources.outages.rate``, ``queries[2].colour``); ``read`` reads
a JSON or YAML file; ``Base`` is what every kind of workload has; ``protocol_params`` and ``query_keys``
refuse parameters and query fields nothing reads. The loaders (``workload.py``: fleets; ``relay.py``;
``summary.py``) and the trace reader (``sources.py``) import these; ``workload.load`` picks the loader.
"""
import inspect
import json
import math
import os

from backend.coordinator.core.queries import ENTITIES


class WorkloadError(ValueError):
    """A workload that cannot be run; the message names the key at fault."""


QUERY = ("id", "kind", "sources", "weights", "precision", "range", "confidence")
QUERY_EXTRA = {"range": ("k", "point", "rank_tolerance", "fp_tolerance", "fn_tolerance", "lag"),   # (lag: refused, why)
               "summary": ("type", "window", "value", "radius", "every"),
               "relay": ("error", "window", "span"),
               "sum": ("lag", "segment"), "avg": ("lag", "segment"), "min": ("lag", "segment"),
               "max": ("lag", "segment"), "count": ("lag",)}     # lag: backend/coordinator/core/finals.py, segments.py


def number(d, key, default, where, lo=None, positive=False):
    """``d[key]`` (or ``default``) as a finite float, optionally > 0 or >= ``lo``."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise WorkloadError("%s.%s must be a finite number, got %r" % (where, key, v))
    if positive and v <= 0:
        raise WorkloadError("%s.%s must be > 0, got %r" % (where, key, v))
    if lo is not None and v < lo:
        raise WorkloadError("%s.%s must be >= %s, got %r" % (where, key, lo, v))
    return float(v)


def integer(d, key, default, where, lo=1, hi=None):
    """``d[key]`` (or ``default``) as an integer in ``lo..hi``."""
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        raise WorkloadError("%s.%s must be an integer >= %d%s, got %r" % (
            where, key, lo, "" if hi is None else " and <= %d" % hi, v))
    return v


def pair(d, key, default, where):
    """``d[key]`` as ``(lo, hi)``: a number stands for ``[v, v]``."""
    v = d.get(key, default)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v, v]
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v) or v[1] < v[0]:
        raise WorkloadError("%s.%s must be a number or [lo, hi] with lo <= hi, got %r" % (where, key, v))
    return float(v[0]), float(v[1])


def keys(d, allowed, where):
    """Refuse every key of object ``d`` that is not in ``allowed``, naming it as ``where.key``."""
    if not isinstance(d, dict):
        raise WorkloadError("%s must be an object, got %r" % (where or "a workload", d))
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        names = ", ".join((where + "." if where else "") + k for k in unknown)
        raise WorkloadError("unknown key%s %s (known here: %s)" % (
            "s" if len(unknown) > 1 else "", names, ", ".join(sorted(allowed))))
    return d


def read(path):
    """The object in workload file ``path`` (JSON, or YAML by extension)."""
    if not os.path.exists(path):
        raise WorkloadError("workload file %s does not exist" % path)
    with open(path) as fh:
        text = fh.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise WorkloadError("%s is not valid YAML: %s" % (path, e))
    try:
        return json.loads(text)
    except ValueError as e:
        raise WorkloadError("%s is not valid JSON: %s" % (path, e))


class Base:
    """What every kind of workload has: its known top-level ``KEYS``, a name, a seed and the raw dict."""
    kind = KEYS = None
    name = "workload"

    def __init__(self, raw):
        keys(raw, self.KEYS, "")
        self.raw = raw
        self.name = str(raw.get("name", self.name))
        self.seed = integer(raw, "seed", 0, "workload", lo=0)


def protocol_params(cls, params, where="params", skip=()):
    """Check that protocol class ``cls`` takes every key of ``params`` (minus ``skip``); returns them."""
    accepted, open_ended = set(), True
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is None or not open_ended:
            continue
        ps = inspect.signature(init).parameters.values()
        accepted.update(p.name for p in ps if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self")
        open_ended = any(p.kind == p.VAR_KEYWORD for p in ps)
    given = {k: v for k, v in params.items() if k not in skip}
    keys(given, accepted, where)
    return given


def query_keys(spec, where, topology=None):
    """Refuse a query field that no query of its kind reads."""
    if isinstance(spec, dict):
        kind = spec.get("kind")
        extra = QUERY_EXTRA.get("range" if kind in ENTITIES else kind, ())
        keys(spec, QUERY + extra + (QUERY_EXTRA["relay"] if topology == "relay" else ()), where)
