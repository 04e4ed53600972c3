"""The one adapter layer every driver uses (DESIGN.md §2, §3): settings, spec inbox, dispatch.

The simulator, the live coordinator and the Spark job each own I/O and time only; everything else
between them and the sans-IO ``Coordinator`` lives here, once:

* ``SETTINGS``/``build``: a coordinator from settings with one set of defaults (``skew``: the device
  clock offset σ the coordinator covers, see ``coordinator.core.integrity``);
* ``Host``: a coordinator plus its spec inbox. Every input is a record ``(now, device-or-query,
  channel, payload)`` as the broker or the spool delivers it; query changes take effect at event time
  ``max(clock, now - λ)`` (as a Last Will does); a spec naming sources not born yet waits, and
  ``"sources": "all"`` follows the fleet as devices are born;
* ``dispatch``: actions to a driver's sink; ``digest``: a host's state as JSON for status files.

How an answer is written (record, guarantee word, strict JSON) is ``backend/answers.py``.
"""
import json
import math
from itertools import islice

from backend.coordinator.core.admission import RATE, registry_owners
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.core.queries import QueryError
from backend.coordinator.protocols import make


# The settings every driver accepts, with the one set of defaults (T and S of Olston et al. §3.1). The
# protocol is the product's, adaptive, for every live driver; a simulator workload names its own (its
# default stays deadband, ``backend.sim.workload``: a workload file is an experiment record).
SETTINGS = {"protocol": "adaptive", "period": 10.0, "shrink": 0.05, "latency": 0.0, "beat": None,
            "skew": 0.0, "t0": None, "params": None, "models": None, "echo": False, "registry": None,
            "rate": RATE, "ack_delay": 0.0}
# ``registry``: a credentials.json whose ``sources`` ({device: [source, ...]}, written by ``quietfleet broker``
# and ``quietfleet fleet``) say which device may name which source in its birth; ``rate``: the messages/s a
# device may send before it is quarantined (0: no limit). Both: coordinator/core/admission.py. ``ack_delay``: on a
# lossy link, how long a device is quiet before its uplinks are acknowledged (0: at once; a longer one sends
# fewer acks and withdraws more answers, a resend coming later: coordinator/core/acks.py).
# Filter models devices may use (edge.core.predict): the setting ``models`` or ``params.models``; None
# takes ``DEFAULT_MODELS``. "choose" picks constant, linear or lead (centred past the reading) per source online.
MODELS = {"constant": 1, "linear": 2, "choose": 7}
DEFAULT_MODELS = "choose"
# λ on a real network (loopback delay plus clock skew between processes): the live coordinator's and
# the Spark backend's command-line default; the simulator states its own in the workload.
LIVE_LATENCY = 0.5
# The device heartbeat B (setting ``beat``): None, the default of every driver, is per device, derived from
# λ and its uplink rate (backend/coordinator/core/heartbeat.py); a device silent for B sends a mark, so the
# integrity watchdog finds a device gone quiet (a lost last report, a partition, a reboot whose birth was
# lost) within B + λ + margin. A number fixes B for every device; 0 turns marks and the watchdog off.
LIVE_BEAT = None
# The device clock offset σ the live drivers cover (``skew``): clocks within ±σ of the backend's are
# placed without an alarm until their measured bounds say more (backend/coordinator/core/offsets.py);
# NTP keeps real devices within tens of ms.
LIVE_SKEW = 0.1
LIVE_SETTINGS = ("protocol", "period", "shrink", "latency", "beat", "models", "skew", "ack_delay")
# How a spec's error begins while its sources are not born yet: a state (logged at INFO), not a refusal.
WAITING = "waiting for sources"


def settings(given=None, **overrides):
    """Complete settings: ``SETTINGS`` updated by ``given`` and ``overrides``; unknown keys are an error."""
    s = dict(SETTINGS)
    for src in (given or {}), overrides:
        for key, value in src.items():
            if key not in SETTINGS:
                raise ValueError("unknown setting %r (have: %s)" % (key, ", ".join(SETTINGS)))
            s[key] = value
    for key in ("period", "shrink", "latency", "skew", "rate", "ack_delay") + (("t0",) if s["t0"] is not None else ()) \
            + (("beat",) if s["beat"] is not None else ()):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError("setting %s must be a finite number, got %r" % (key, v))
    if not isinstance(s["protocol"], str) or not isinstance(s["params"] or {}, dict):
        raise ValueError("setting protocol must be a name and params an object, got %r, %r"
                         % (s["protocol"], s["params"]))
    if s["params"] and "models" in s["params"]:       # every driver passes params: models may ride there
        s["params"] = dict(s["params"])
        s["models"] = s["params"].pop("models")
    if s["rate"] < 0 or s["ack_delay"] < 0 or not isinstance(s["registry"] or "", str):
        raise ValueError("settings rate and ack_delay must be at least 0 and registry a path, got %r, %r, %r"
                         % (s["rate"], s["ack_delay"], s["registry"]))
    if s["models"] is not None and s["models"] not in MODELS:
        raise ValueError("setting models must be one of %s, got %r" % (", ".join(MODELS), s["models"]))
    return s


def from_args(args, **overrides):
    """Settings of a live driver from its command-line options (``LIVE_SETTINGS``; unset ones, or an option
    the command lacks, take ``SETTINGS``' defaults; the command line gives λ and B their live defaults)."""
    return settings({k: getattr(args, k) for k in LIVE_SETTINGS if getattr(args, k, None) is not None}, **overrides)


def build(given=None, **overrides):
    """A ``Coordinator`` running ``settings(given, **overrides)``."""
    s = settings(given, **overrides)
    try:
        protocol = make(s["protocol"], **(s["params"] or {}))
    except TypeError as e:          # a parameter the protocol does not take
        raise ValueError("protocol %s: %s" % (s["protocol"], e))
    return Coordinator(protocol, period=s["period"], shrink=s["shrink"] if protocol.shrinks else 0.0,
                       latency=s["latency"], beat=s["beat"], t0=s["t0"] or 0.0,
                       models=MODELS[s["models"] or DEFAULT_MODELS], skew=s["skew"], echo=bool(s["echo"]),
                       owners=owners(s["registry"]), rate=s["rate"], ack_delay=s["ack_delay"])


def owners(registry):
    """``{source: device}`` from a registry file (``SETTINGS``), or None without one."""
    if not registry:
        return None
    try:
        with open(registry) as f:
            sources = json.load(f).get("sources") or {}
        if not isinstance(sources, dict) or not all(isinstance(v, list) for v in sources.values()):
            raise ValueError("its sources must be {device: [source, ...]}")
        return registry_owners(sources)
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError("registry %s: %s" % (registry, e))


def new_incarnation(now, previous=None):
    """The incarnation of a backend run starting at wall-clock time ``now``: whole seconds (32-bit serial
    order holds for 68 years), and later than ``previous`` (the last run's, if known) in that order."""
    inc = int(now) & 0xFFFFFFFF
    if previous is not None and not 0 < (inc - previous) & 0xFFFFFFFF < 0x80000000:
        inc = (previous + 1) & 0xFFFFFFFF
    return inc


def dispatch(actions, sink):
    """Hand each action to ``sink``: ``down(device, payload)``, ``answer(change)``,
    ``error(query, message)``, ``retract(query)``."""
    for a in actions:
        kind = a[0]
        if kind == "down":
            sink.down(a[1], a[2])
        elif kind == "answer":
            sink.answer(a[1])
        elif kind == "error":
            sink.error(a[1], a[2])
        elif kind == "retract":
            sink.retract(a[1])
        else:
            raise ValueError("unknown action %r" % (kind,))


class Host:
    """A ``Coordinator`` and its spec inbox, fed records by a driver; every call returns actions.

    Actions: the coordinator's ``("down", device, payload)`` and ``("answer", change)``, plus
    ``("error", query, message)`` for a refused or waiting spec and ``("retract", query)`` for a
    removal. ``now`` is made monotone; without a ``t0`` the adjustment ticks start at the first
    record's time (whole seconds), so a replay of the same records is identical. ``declared``:
    sources (in order) that specs may name before their devices are born (the simulator's fleet)."""

    def __init__(self, given=None, declared=(), **overrides):
        self.settings = settings(given, **overrides)
        self.coord = build(self.settings)
        if declared:
            self.coord.declare_sources(declared)
        self.t0 = self.settings["t0"]
        self.now = -math.inf
        self.specs = {}          # query id -> spec as registered (``"all"`` kept, to follow the fleet)
        self.pending = {}        # query id -> spec waiting for its sources to be born
        self._left = {}          # query id -> its sources not born when last checked, the next to check last
        self.records = 0
        self.blind = False       # the driver's broker link is lost (``link_lost``) and not yet restored
        self.stats = {"foreign": 0, "bad_specs": 0}
        self._declared = frozenset(self.coord.declared)
        self._seen = self._extra = 0     # births counted by _everyone, and how many were not declared

    def record(self, now, name, channel, payload, retained=False):
        """One broker message or spool record: ``channel`` is ``up``/``state`` (``name`` a device), ``ctl``
        (a downlink to device ``name``: echo mode), ``spec`` (``name`` a query id), or a spool record: ``tick``
        (time only), ``link`` (``lost``/``restored``: the bridge's broker link), ``inc`` (a new backend run, its
        incarnation in decimal), ``sent`` (the controls made so far leave now: echo mode), ``adopt`` (``name`` a
        device another group's Host owned until query groups merged); anything else is counted and ignored."""
        self.records += 1
        if (channel == "up" or channel == "state") and name:
            return self.uplink(now, name, payload, retained)
        if channel == "tick":
            return self.timer(now)
        if channel == "ctl" and name:
            return self._step(self.coord.handle_echo, self._clock(now), name, bytes(payload or b""))
        if channel == "spec" and name:
            return self.spec(now, name, payload)
        if channel == "adopt" and name:
            return self._step(self.coord.adopt, self._clock(now), name)
        if channel == "link" and payload in (b"lost", b"restored"):
            return self.link_lost(now) if payload == b"lost" else self.link_restored(now)
        if channel == "inc" and payload and bytes(payload).isdigit() and int(payload) <= 0xFFFFFFFF:
            return self.incarnation(now, int(payload))
        if channel == "sent":
            return self._step(self.coord.published, self._clock(now))
        self._clock(now)
        self.stats["foreign"] += 1
        return []

    def uplink(self, now, device, payload, retained=False):
        return self._step(self.coord.handle_uplink, self._clock(now), device, bytes(payload or b""),
                          retained=bool(retained))

    def timer(self, now):
        return self._step(self.coord.handle_timer, self._clock(now))

    def next_deadline(self):
        return self.coord.next_deadline()

    def alerts(self):
        """Warnings since the last call, one line each (device, reason): refused sources, conflicts, bad
        messages, floods, implausible times and values (``coordinator.core.admission``), rate-limited."""
        return self.coord.admission.drain()

    def link_lost(self, now):
        """The driver lost its broker (the live client's disconnect, the bridge's ``link`` record): blind
        until ``link_restored``, every device counts as gone at ``now - λ``, so answers degrade as the
        clock moves on (the bridge keeps ticking). Once per loss."""
        if self.blind:
            return self.timer(now)
        self.blind = True
        return self._step(self.coord.link_lost, self._clock(now))

    def link_restored(self, now):
        """Back on the broker after a loss: every known device is asked for a fresh birth."""
        if not self.blind:
            return self.timer(now)
        self.blind = False
        return self._step(self.coord.link_restored, self._clock(now))

    def incarnation(self, now, inc):
        """A new backend run (``new_incarnation``): every downlink from now on carries ``inc``, and each
        device gets a config of this run before its next control; a device drops the controls of
        earlier runs (``edge.agent.current``), so a replay of an old run's output cannot override it.
        A run starts linked: if the last one died blind, its devices are asked for fresh births."""
        self._clock(now)
        self.coord.inc = inc & 0xFFFFFFFF
        return self.link_restored(now) if self.blind else []

    def _step(self, call, now, *args, **kw):
        """``call`` (which may release queued births), then whatever the new sources let happen."""
        known = len(self.coord.cache.sources)
        out = call(now, *args, **kw)
        return out + self._born(now) if len(self.coord.cache.sources) != known else out

    def _clock(self, now):
        if self.t0 is None:
            self.t0 = self.coord.t0 = float(math.floor(now))
        if now > self.now:
            self.now = now
        return self.now

    def event_time(self, now):
        """When a query change takes effect: ``now - λ``, never before the coordinator's clock nor
        before its time origin ``t0`` (a query registered with the first record holds from t0)."""
        return max(self.coord.clock, now - self.coord.latency, self.coord.t0)

    def spec(self, now, qid, spec):
        """Register, replace or (empty ``spec``) remove query ``qid``; ``spec`` is a dict or JSON text."""
        now = self._clock(now)
        if not isinstance(qid, str) or not qid:
            return self._bad(qid, "a query needs a non-empty string id, got %r" % (qid,))
        if self._same(qid, spec):
            return []                       # the spec it runs (a retained spec again after a reconnect)
        out = self._remove(now, qid)
        if self._empty(spec):
            return out + [("retract", qid)]
        if isinstance(spec, (bytes, bytearray, str)):
            try:
                spec = json.loads(spec)
            except ValueError as e:          # bad JSON or bad UTF-8
                return out + self._bad(qid, "query spec is not JSON: %s" % e)
        if not isinstance(spec, dict):
            return out + self._bad(qid, "query spec must be a JSON object")
        spec = dict(spec)
        if spec.setdefault("id", qid) != qid:
            return out + self._bad(qid, "spec id %r differs from its query id %r" % (spec["id"], qid))
        return out + self._add(now, qid, spec)

    def set_precision(self, now, qid, precision):
        now = self._clock(now)
        if qid not in self.specs:
            return self._bad(qid, "no registered query %r to set the precision of" % (qid,))
        try:
            out = self.coord.set_precision(qid, precision, self.event_time(now))
        except QueryError as e:
            return self._bad(qid, str(e))
        self.specs[qid]["precision"] = precision
        return out

    def _same(self, qid, spec):
        """Whether ``spec`` (dict or JSON text) is exactly the spec query ``qid`` runs or waits with."""
        have = self.specs.get(qid) or self.pending.get(qid)
        if have is None or self._empty(spec):
            return False
        if isinstance(spec, (bytes, bytearray, str)):
            try:
                spec = json.loads(spec)
            except ValueError:
                return False
        return isinstance(spec, dict) and dict(spec, id=spec.get("id", qid)) == have

    @staticmethod
    def _empty(spec):
        if spec is None:
            return True
        if isinstance(spec, (bytes, bytearray, str)):
            return not spec.strip()
        return False

    def _remove(self, now, qid):
        self.pending.pop(qid, None)
        self._left.pop(qid, None)
        if self.specs.pop(qid, None) is not None and qid in self.coord.queries:
            return self.coord.remove_query(qid, self.event_time(now))
        return []

    def _missing(self, spec):
        """Sources of ``spec`` not born (nor declared) yet; ``["all"]`` while no source is known."""
        srcs = spec.get("sources", "all")
        born = self.coord.cache.sources
        if srcs == "all":
            return [] if born or self._declared else ["all"]
        return [s for s in srcs if isinstance(s, str) and s not in born and s not in self._declared] \
            if isinstance(srcs, list) else []

    def _add(self, now, qid, spec):
        missing = self._missing(spec)
        if missing:
            self.pending[qid] = spec
            self._left[qid] = missing[::-1]
            return [("error", qid, "%s %s to be born" % (WAITING, ", ".join(missing[:5])))]
        try:
            out = self.coord.add_query(spec, self.event_time(now))
        except QueryError as e:
            return self.coord.drain() + self._bad(qid, str(e))
        self.specs[qid] = spec
        return out

    def _bad(self, qid, message):
        self.stats["bad_specs"] += 1
        return [("error", qid, message)]

    def _born(self, now):
        """New sources: waiting specs may now register, and ``"all"`` queries take them in (the
        query is replaced by one over the grown fleet, at the event time of the birth's release)."""
        out = []
        everyone = self._everyone()
        for qid, spec in sorted(self.specs.items()):
            if spec.get("sources", "all") == "all" and len(self.coord.queries[qid].sources) != everyone:
                try:
                    out += self.coord.replace_query(spec, self.event_time(now))
                except QueryError as e:
                    self.specs.pop(qid)
                    if qid in self.coord.queries:   # the grown spec was refused: the old query goes too
                        out += self.coord.remove_query(qid, self.event_time(now))
                    out += self.coord.drain() + self._bad(qid, str(e))
        for qid, spec in sorted(self.pending.items()):
            if not self._waits(qid):
                del self.pending[qid], self._left[qid]
                out += self._add(now, qid, spec)
        return out

    def _waits(self, qid):
        """Whether waiting spec ``qid`` still misses a source: its missing sources are checked in order
        and each only until it is born, so a spec over n sources costs O(n) over all births, not per birth."""
        left = self._left[qid]
        if left == ["all"]:
            left = self._left[qid] = self._missing(self.pending[qid])
        born, declared = self.coord.cache.sources, self._declared
        while left and (left[-1] in born or left[-1] in declared):
            left.pop()
        return bool(left)

    def _everyone(self):
        """How many sources ``"all"`` means now (declared or born), counted over the newest births
        only: a fleet of n devices costs O(n) in all, not O(n) per birth."""
        born = self.coord.cache.sources
        for key in islice(reversed(born), len(born) - self._seen):
            self._extra += key not in self._declared
        self._seen = len(born)
        return len(self._declared) + self._extra


def digest(host, sources=True, queries=True):
    """A JSON-able digest of a host (or of a bare ``Coordinator``: its own part only): clock, counters,
    (optionally) the latest answers and every source's mirrored filter. Two hosts that took the same
    records have equal digests. Without ``sources`` and ``queries`` its cost does not grow with the fleet."""
    coord = getattr(host, "coord", host)
    d = {"clock": coord.clock if math.isfinite(coord.clock) else None, "stats": dict(coord.stats),
         "sources_known": len(coord.cache.sources), "online": coord.cache.up}
    if queries:
        d["queries"] = {qid: coord.last.get(qid) for qid in sorted(coord.queries)}
    flagged = coord.admission.devices
    d["offenders"] = {dev: dict(flagged[dev]) for dev in sorted(flagged, key=lambda k: (-sum(flagged[k].values()), k))[:20]}
    d["in_quarantine"] = sorted(coord.admission.until)
    d["contested"] = {k: list(v) for k, v in coord.admission.contested.items()}
    if host is not coord:
        d.update(records=host.records, pending=sorted(host.pending), host_stats=dict(host.stats),
                 protocol=host.settings["protocol"], now=host.now if math.isfinite(host.now) else None)
    if sources:
        d["sources"] = {k: [s.device, s.value, s.filt.lo, s.filt.hi, s.filt.width, s.filt.epoch, s.online,
                            s.last_t, len(s.old)] for k, s in sorted(coord.cache.sources.items())}
    return d
