"""Workload files for the simulator (DESIGN.md §5): one loader for every kind, with public helpers.

``load(path_or_dict)`` reads a JSON or YAML workload, picks its kind — a fleet of filter agents
(``Workload`` here), a relay topology (``backend.sim.relay``) or a summary-site tree
(``backend.sim.summary``) — and validates everything up front. Any problem, including a key the
simulator does not know anywhere in the file, raises ``WorkloadError`` with a message naming the key
(``network.los``, ``sources.outages.rate``, ``queries[2].colour``). The helpers every kind validates
with (``number``, ``pair``, ``integer``, ``keys``, ``read``, ``Base``) are in ``spec.py``.
"""
import os

from backend.coordinator.core.queries import QueryError, parse_query
from backend.sim.spec import Base, WorkloadError, integer, keys, number, pair, protocol_params, query_keys, read


GENERATORS = ("random_walk", "uniform", "brownian")
TOP = ("name", "seed", "duration", "protocol", "params", "network", "sources", "queries", "warmup", "events")
NETWORK = ("delay", "uplink", "downlink", "jitter", "latency_tolerance",
           "loss", "duplicate", "reorder", "skew", "reboots", "partitions")
SOURCES = {"generator": ("generator", "count", "start", "step", "range", "interval", "arrival", "steps", "drift",
                         "volatility"), "trace": ("trace",), "dataset": ("dataset",)}
SETTINGS = ("period", "shrink", "heartbeat", "models", "ack_delay")   # params the coordinator takes; the rest go to the protocol


def kind(raw):
    """Which simulation a workload object describes: ``fleet``, ``relay`` or ``summary``."""
    from backend.coordinator.protocols import PROTOCOLS
    from backend.sim.sites import SYSTEMS
    if not isinstance(raw, dict):
        raise WorkloadError("a workload must be a JSON/YAML object")
    proto = raw.get("protocol")
    if "relays" in raw or getattr(PROTOCOLS.get(proto), "topology", None) == "relay":
        return "relay"
    if proto in SYSTEMS or "clients" in raw or "data" in raw:
        return "summary"
    return "fleet"


def load(source):
    """Load and validate a workload of any kind from a path (JSON or YAML) or a dict."""
    base = "."
    if not isinstance(source, dict):
        base = os.path.dirname(os.path.abspath(source))
        source = read(source)
    k = kind(source)
    if k == "relay":
        from backend.sim.relay import RelayWorkload
        return RelayWorkload(source)
    if k == "summary":
        from backend.sim.summary import SummaryWorkload
        return SummaryWorkload(source)
    return Workload(source, base)


class Workload(Base):
    """A validated fleet workload. ``raw`` keeps the dict it was made from."""
    kind, KEYS = "fleet", TOP

    def __init__(self, raw, base_dir="."):
        Base.__init__(self, raw)
        self.base_dir = base_dir
        if "duration" not in raw:
            raise WorkloadError("workload.duration (simulated seconds) is required")
        self.duration = number(raw, "duration", None, "workload", positive=True)
        self.protocol = raw.get("protocol", "deadband")
        if not isinstance(self.protocol, str):
            raise WorkloadError("protocol must be a name, got %r" % (self.protocol,))
        params = raw.get("params", {})
        if not isinstance(params, dict):
            raise WorkloadError("params must be an object")
        self.params = params
        self.period = number(params, "period", 10.0, "params", positive=True)
        self.shrink = number(params, "shrink", 0.05, "params", lo=0.0)
        if self.shrink >= 1:
            raise WorkloadError("params.shrink must be < 1")
        # the heartbeat B: per device by default (None), or one number for every device (0: off)
        self.beat = None if params.get("heartbeat") is None else number(params, "heartbeat", 0.0, "params", lo=0.0)
        self.ack_delay = number(params, "ack_delay", 0.0, "params", lo=0.0)     # (backend.coordinator.core.acks)
        self.protocol_params = protocol_params(self.protocol_class(), params, skip=SETTINGS)
        self._check_protocol(params)
        net = raw.get("network", {})
        if isinstance(net, (int, float)) and not isinstance(net, bool):
            net = {"delay": net}
        keys(net, NETWORK, "network")
        self.delay_up = number(net, "uplink", number(net, "delay", 0.0, "network", lo=0.0), "network", lo=0.0)
        self.delay_down = number(net, "downlink", number(net, "delay", 0.0, "network", lo=0.0), "network", lo=0.0)
        self.jitter = number(net, "jitter", 0.0, "network", lo=0.0)
        self.latency = number(net, "latency_tolerance", max(self.delay_up, self.delay_down) + self.jitter,
                              "network", lo=0.0)
        self._sources(raw.get("sources"))
        self.faults = _faults(net, {d for d, _ in self.devices()})
        qs = raw.get("queries", [])
        if not isinstance(qs, list):
            raise WorkloadError("queries must be a list")
        self.queries = qs
        kinds = self.protocol_class().kinds
        ids = set()
        for n, q in enumerate(qs):
            query_keys(q, "queries[%d]" % n)
            try:
                parsed = parse_query(q, self.source_ids, kinds=kinds)
            except QueryError as e:
                raise WorkloadError(str(e))
            if parsed.id in ids:
                raise WorkloadError("query id %s repeats" % parsed.id)
            ids.add(parsed.id)
        self.warmup = number(raw, "warmup", 0.0, "workload", lo=0.0)
        if self.warmup >= self.duration:
            raise WorkloadError("workload.warmup must be shorter than the duration")
        self.events = _events(raw.get("events", []), ids, set(self.source_ids), kinds)

    def protocol_class(self):
        from backend.coordinator.protocols import PROTOCOLS
        cls = PROTOCOLS.get(self.protocol)
        if cls is None:
            raise WorkloadError("unknown protocol %r; choose one of %s" % (self.protocol, ", ".join(sorted(PROTOCOLS))))
        if getattr(cls, "topology", None) == "relay":
            raise WorkloadError("protocol %s runs on a relay topology: give the workload a relays key" % self.protocol)
        return cls

    def _check_protocol(self, params):
        """Make the protocol and check the filter models as the simulation will, so a bad parameter is
        refused here, naming it, and not half way through a run."""
        from backend.coordinator.protocols import make
        from backend.host import MODELS
        if params.get("models") is not None and params["models"] not in MODELS:
            raise WorkloadError("params.models must be one of %s, got %r" % (", ".join(MODELS), params["models"]))
        if self.period < 0.001:
            raise WorkloadError("params.period must be at least 0.001 s, got %r" % self.period)
        try:
            make(self.protocol, **self.protocol_params)
        except ValueError as e:
            raise WorkloadError("params: %s" % e)

    def query_kinds(self):
        return self.protocol_class().kinds

    def _sources(self, src):
        if not isinstance(src, dict):
            raise WorkloadError('sources must be {"trace": "file.csv"}, {"dataset": "temps"} or '
                                '{"generator": ..., "count": N}')
        mode = "dataset" if "dataset" in src else "trace" if "trace" in src else "generator"
        keys(src, SOURCES[mode] + ("per_device", "outages"), "sources")
        self.sources = src
        self.per_device = integer(src, "per_device", 1, "sources", hi=255)
        out = src.get("outages")
        if out is not None:
            if not isinstance(out, dict):
                raise WorkloadError('sources.outages must be {"rate": per-device outages/s, "mean_length": s}')
            keys(out, ("rate", "mean_length"), "sources.outages")
            number(out, "rate", None, "sources.outages", lo=0.0)
            number(out, "mean_length", None, "sources.outages", positive=True)
        if mode == "dataset":
            from backend.sim.datasets import DATASETS, load_dataset
            if src["dataset"] not in DATASETS:
                raise WorkloadError("sources.dataset must be one of %s, got %r" % (", ".join(DATASETS), src["dataset"]))
            self.trace = load_dataset(src["dataset"])
            self.source_ids = sorted(set(self.trace[1]))
        elif mode == "trace":
            from backend.sim.sources import read_trace
            path = src["trace"]
            if not isinstance(path, str):
                raise WorkloadError("sources.trace must be a file path")
            if not os.path.isabs(path):
                path = os.path.join(self.base_dir, path)
            self.trace = read_trace(path)
            self.source_ids = sorted(set(self.trace[1]))
        else:
            gen = src.get("generator")
            if gen not in GENERATORS:
                raise WorkloadError("sources.generator must be one of %s, got %r" % (", ".join(GENERATORS), gen))
            count = src.get("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise WorkloadError("sources.count must be a positive integer")
            self.trace = None
            self.source_ids = ["s%d" % i for i in range(count)]
            pair(src, "start", 0.0, "sources")
            pair(src, "step", 1.0, "sources")
            pair(src, "range", [0.0, 1000.0], "sources")
            number(src, "interval", 1.0, "sources", positive=True)
            if src.get("arrival", "periodic") not in ("periodic", "exponential"):
                raise WorkloadError("sources.arrival must be periodic or exponential")
            if src.get("steps", "binary") not in ("binary", "normal"):
                raise WorkloadError("sources.steps must be binary or normal")
            pair(src, "drift", 0.0, "sources")
            if pair(src, "volatility", 1.0, "sources")[0] < 0:
                raise WorkloadError("sources.volatility must be >= 0")

    def devices(self):
        """[(device id, [source ids])] grouping ``per_device`` sources per device."""
        ids = self.source_ids
        return [("d%d" % (i // self.per_device), ids[i:i + self.per_device]) for i in range(0, len(ids), self.per_device)]


def _events(evs, active, sources, kinds):
    """Validate ``events`` (queries added/removed, precisions and network delays changed while running)."""
    if not isinstance(evs, list):
        raise WorkloadError("events must be a list")
    used = set(active)
    active = set(active)
    out = []
    for n, ev in enumerate(sorted(evs, key=lambda e: e.get("time", 0) if isinstance(e, dict) else 0)):
        where = "events[%d]" % n
        if not isinstance(ev, dict):
            raise WorkloadError("%s must be an object" % where)
        t = number(ev, "time", None, where, lo=0.0)
        keys(ev, ("time", "add_query", "remove_query", "set_precision", "delay"), where)
        what = [k for k in ("add_query", "remove_query", "set_precision", "delay") if k in ev]
        if len(what) != 1:
            raise WorkloadError("%s needs a time and exactly one of add_query, remove_query, set_precision, delay" % where)
        k = what[0]
        v = ev[k]
        if k == "add_query":
            query_keys(v, where + ".add_query")
            try:
                q = parse_query(v, sources, kinds=kinds)
            except QueryError as e:
                raise WorkloadError("%s.add_query: %s" % (where, e))
            if q.id in used:
                raise WorkloadError("%s.add_query: query id %s was already used" % (where, q.id))
            used.add(q.id)
            active.add(q.id)
        elif k == "remove_query":
            if v not in active:
                raise WorkloadError("%s.remove_query: no running query %r" % (where, v))
            active.discard(v)
        elif k == "set_precision":
            if not isinstance(v, dict) or v.get("id") not in active:
                raise WorkloadError("%s.set_precision needs the id of a running query" % where)
            keys(v, ("id", "precision"), where + ".set_precision")
            v = {"id": v["id"], "precision": number(v, "precision", None, where + ".set_precision", lo=0.0)}
        else:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = {"delay": v}
            if not isinstance(v, dict) or not v:
                raise WorkloadError("%s.delay must be seconds or {uplink, downlink, jitter}" % where)
            keys(v, ("delay", "uplink", "downlink", "jitter"), where + ".delay")
            d = {}
            if "delay" in v:
                d["up"] = d["down"] = number(v, "delay", None, where + ".delay", lo=0.0)
            if "uplink" in v:
                d["up"] = number(v, "uplink", None, where + ".delay", lo=0.0)
            if "downlink" in v:
                d["down"] = number(v, "downlink", None, where + ".delay", lo=0.0)
            if "jitter" in v:
                d["jitter"] = number(v, "jitter", None, where + ".delay", lo=0.0)
            v = d
        out.append({"time": t, k: v})
    return out


def _faults(net, devices):
    """The hostile network of ``network`` (issue #20): probabilities, skew (s), reboots/h, partitions."""
    f = {}
    for k in ("loss", "duplicate", "reorder"):
        p = number(net, k, 0.0, "network", lo=0.0)
        if p >= 1:
            raise WorkloadError("network.%s is a probability per message, must be < 1" % k)
        f[k] = p
    f["skew"] = number(net, "skew", 0.0, "network", lo=0.0)
    f["reboots"] = number(net, "reboots", 0.0, "network", lo=0.0)
    parts = net.get("partitions", [])
    if not isinstance(parts, list):
        raise WorkloadError("network.partitions must be a list of [start, end, devices or \"all\"]")
    f["partitions"] = []
    for n, p in enumerate(parts):
        where = "network.partitions[%d]" % n
        if not isinstance(p, list) or len(p) != 3:
            raise WorkloadError("%s must be [start, end, devices or \"all\"]" % where)
        start, stop = number({"start": p[0]}, "start", None, where, lo=0.0), \
            number({"end": p[1]}, "end", None, where, lo=0.0)
        if stop <= start:
            raise WorkloadError("%s ends before it starts" % where)
        if p[2] == "all":
            devs = None
        elif isinstance(p[2], list) and all(isinstance(d, str) for d in p[2]):
            unknown = [d for d in p[2] if d not in devices]
            if unknown:
                raise WorkloadError("%s names unknown device %r" % (where, unknown[0]))
            devs = frozenset(p[2])
        else:
            raise WorkloadError("%s: devices must be a list of device names or \"all\"" % where)
        f["partitions"].append((start, stop, devs))
    return f if any(f[k] for k in f) else {}
