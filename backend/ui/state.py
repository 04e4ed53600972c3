"""The dashboard's state model (DESIGN.md §10), sans-IO: broker messages in, ``/api/state`` out.

One model for every driver (demo, live coordinator, Spark backend): it is fed what the broker carries
(DESIGN.md §3), never the driver's objects, so the page is the same whoever answers.

* ``qf/<fleet>/q/<id>/answer``: the retained answer JSON (``backend.host.answer_record``) or an
  ``error_record``; an empty payload retracts the query. Each query keeps its latest record and a
  bounded history of its answer changes (``history`` points: time, lo, hi, final, degraded).
* ``qf/<fleet>/q/<id>/spec``: the query's kind and precision (specs a driver was given on its command
  line come through ``spec`` instead).
* ``qf/<fleet>/d/<dev>/state``: births (sources, firmware, capabilities; online) and Last Wills
  (``gone``: offline), decoded with ``edge.core.codec``.
* ``qf/<fleet>/d/<dev>/up``: counted per device; the filter model each source reports with comes
  from the report kind (``report`` constant, ``line`` linear, ``segs`` and ``rsegs`` segment mode).
* ``qf/<fleet>/d/<dev>/ctl``: counted (downlinks).
* ``qf/<fleet>/backend/state``: the backend's online state or Last Will (``backend.live.presence``);
  while it says offline every query row is ``stale`` with the reason, whatever its last answer says.

Devices are paged and searched on the server (``devices_page``): the id order is sorted lazily (once
after a batch of births), a search is a substring scan over one precomputed string per device and
its result is cached until a device or its sources change, so a page of a 50,000-device fleet costs
a slice, not the fleet. Nothing here reads a clock or a socket: every input carries ``now``.
"""
import json
import math
from collections import deque

from backend.answers import strict
from backend.live import presence
from edge.core import codec, topics

HISTORY = 600           # answer changes kept per query
PAGE = 50               # default page of devices
MAX_LIMIT = 500         # largest page a client may ask for
MODELS = {"report": "constant", "line": "linear", "segs": "segment", "mreport": "constant", "mline": "linear",
          "rsegs": "segment"}
_CODE = {codec.SCHEMAS[k][0]: k for k in codec.SCHEMAS if codec.SCHEMAS[k][1] == "up"}
ANSWER_FIELDS = ("lo", "hi", "degraded", "reason", "final", "guarantee", "time", "revoked", "confidence",
                 "estimate", "error_bound", "through")


def _num(x):
    """A float for plotting, None for an unbounded or missing side (strict JSON writes ``"inf"``)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


class Device:
    __slots__ = ("id", "online", "last_seen", "sources", "models", "messages", "births", "fw", "caps", "key")

    def __init__(self, dev):
        self.id = dev
        self.online = None          # None: no birth or will seen yet
        self.last_seen = None       # time of the latest message heard live (a retained one: its birth time)
        self.sources = []
        self.models = {}            # source index -> "constant" | "linear" | "segment"
        self.messages = 0           # uplinks (``up``)
        self.births = 0
        self.fw = None
        self.caps = 0
        self.key = dev.lower()      # what a search matches: id and source names, lower case

    def model(self):
        seen = sorted(set(self.models.values()))
        return "+".join(seen) if seen else None

    def row(self):
        return {"id": self.id, "online": self.online, "last_seen": self.last_seen, "sources": list(self.sources),
                "model": self.model(), "messages": self.messages, "births": self.births, "fw": self.fw}


class Query:
    __slots__ = ("id", "spec", "last", "history", "appended", "changed")

    def __init__(self, qid, history):
        self.id = qid
        self.spec = None            # the spec as registered (kind, precision, sources)
        self.last = None            # the latest answer or error record as published
        self.history = deque(maxlen=history)     # [time, lo, hi, final, degraded]
        self.appended = 0           # points ever appended (a client's cursor into ``history``)
        self.changed = None         # receipt time of the latest record

    def row(self, since=None):
        spec, last = self.spec or {}, self.last or {}
        r = {"id": self.id, "kind": spec.get("kind"), "precision": spec.get("precision"),
             "sources": spec.get("sources") if spec.get("sources") == "all" else len(spec.get("sources") or ()) or None,
             "lag": spec.get("lag"), "error": last.get("error"), "received": self.changed}
        for k in ANSWER_FIELDS:
            r[k] = last.get(k)
        if "members" in last:
            r["members"] = last["members"]
        if since is not None:           # history after the client's cursor (all of it if it fell behind)
            new = self.appended - since
            if since <= 0 or new < 0 or new > len(self.history):
                r["history"], r["reset"] = list(self.history), True
            else:
                r["history"], r["reset"] = list(self.history)[len(self.history) - new:], False
            r["cursor"] = self.appended
        return r


class DashboardState:
    """Everything the dashboard shows, fed broker messages (``message``) with their receipt time."""

    def __init__(self, fleet, history=HISTORY, specs=()):
        self.fleet = fleet
        self.history = history
        self.queries = {}
        self.devices = {}
        self.order = []             # device ids, sorted lazily (``_sorted``)
        self._sorted = True
        self.online = self.offline = 0     # devices whose latest state is a birth / a Last Will
        self.version = 0            # bumps on every change the page shows
        self.devices_version = 0    # bumps on every device change (a page refetches its rows)
        self.index_version = 0      # bumps when the set of devices or their sources change (searches)
        self.counts = {"up": 0, "ctl": 0, "state": 0, "answer": 0, "bad": 0}
        self.backend = None         # the backend's latest state (presence.parse) with its receipt time
        self.started = None
        self._search = (None, None)
        for spec in specs:
            self.spec(spec.get("id"), spec)

    # -- inputs ----------------------------------------------------------------------------------
    def message(self, now, topic, payload, retained=False):
        """One broker message; returns True when it changed what the page shows."""
        if self.started is None:
            self.started = now
        t = topics.parse(topic)
        payload = bytes(payload or b"")
        if t is not None and t[0] == self.fleet and t[1] == "backend":
            return self.backend_state(now, payload)
        if t is None or t[0] != self.fleet or t[2] is None:
            return False
        if t[1] == "q":
            return self.answer(now, t[2], payload) if t[3] in ("answer", "final") else self.spec(t[2], payload)
        if t[3] == "up":
            return self.uplink(now, t[2], payload)
        if t[3] == "state":
            return self.device_state(now, t[2], payload, retained)
        if t[3] == "ctl":
            self.counts["ctl"] += 1
            self.version += 1
            return True
        return False

    def spec(self, qid, spec):
        """A query's spec (dict or JSON text); an empty one (a removed query) is forgotten."""
        if not isinstance(qid, str) or not qid:
            return False
        if isinstance(spec, (bytes, bytearray, str)):
            if not spec.strip():
                q = self.queries.get(qid)
                if q is not None:
                    q.spec = None
                    if q.last is None:
                        del self.queries[qid]
                self.version += 1
                return True
            try:
                spec = json.loads(spec)
            except ValueError:
                spec = {"kind": None}
        if not isinstance(spec, dict):
            spec = {"kind": None}
        self._query(qid).spec = spec
        self.version += 1
        return True

    def backend_state(self, now, payload):
        """The backend's online state or its Last Will; an empty or foreign payload forgets it."""
        state = presence.parse(payload)
        if state is None and payload.strip():
            self.counts["bad"] += 1
        self.backend = None if state is None else dict(state, received=now)
        self.version += 1
        return True

    def answer(self, now, qid, payload):
        """A retained answer or error record; an empty payload retracts the query."""
        self.counts["answer"] += 1
        if not payload.strip():
            if self.queries.pop(qid, None) is not None:
                self.version += 1
                return True
            return False
        try:
            rec = json.loads(payload)
        except ValueError:
            self.counts["bad"] += 1
            return False
        if not isinstance(rec, dict):
            self.counts["bad"] += 1
            return False
        q = self._query(qid)
        if rec == q.last:
            return False                # the same record again (a resubscription, a republished batch)
        q.last, q.changed = rec, now
        if "error" not in rec:
            t = _num(rec.get("time"))
            if "members" in rec and "lo" not in rec:
                lo = hi = float(len(rec["members"] or ()))
            else:
                lo, hi = _num(rec.get("lo")), _num(rec.get("hi"))
            if t is not None:
                q.history.append([t, lo, hi, bool(rec.get("final")), bool(rec.get("degraded"))])
                q.appended += 1
        self.version += 1
        return True

    def device_state(self, now, dev, payload, retained=False):
        """A birth (online; its sources) or a Last Will ``gone`` (offline)."""
        self.counts["state"] += 1
        if not payload:
            return False                # a cleared retained state
        try:
            kind, f = codec.decode(payload)
        except codec.CodecError:
            self.counts["bad"] += 1
            return False
        d = self._device(dev)
        if kind == "birth":
            first = f.get("first", 0)
            names = [s["name"] for s in f.get("sources", ())]
            d.sources = (d.sources[:first] if first else []) + names
            d.key = "\0".join([dev] + d.sources).lower()
            if not first:
                d.births += 1
                d.models = {}
            d.fw, d.caps = f.get("fw"), f.get("caps", 0)
            self._set_online(d, True)
            self.index_version += 1
        elif kind == "gone":
            self._set_online(d, False)
        else:
            self.counts["bad"] += 1
            return False
        d.last_seen = self._seen(now, f, retained)
        self.devices_version += 1
        self.version += 1
        return True

    def uplink(self, now, dev, payload):
        """An uplink: counted; a report tells its source's filter model."""
        self.counts["up"] += 1
        d = self._device(dev)
        d.messages += 1
        d.last_seen = now
        kind = _CODE.get(payload[1]) if len(payload) > 2 and payload[0] == codec.VERSION else None
        if kind in ("report", "line", "mreport", "mline", "rsegs"):     # (rsegs: a segment source's report)
            d.models[payload[2]] = MODELS[kind]
        if kind == "segs" or kind == "rsegs":       # (and the segment records that ride along)
            try:
                for s in codec.decode(payload)[1]["segs"]:
                    d.models[s["src"]] = "segment"
            except (codec.CodecError, KeyError, TypeError):
                self.counts["bad"] += 1
        elif kind is None:
            self.counts["bad"] += 1
        self.devices_version += 1
        self.version += 1
        return True

    def _seen(self, now, fields, retained):
        """Receipt time; for a retained birth or will (sent before we subscribed) the device's own time
        when it is plausible (a board's clock in ms counts from its boot), else unknown."""
        if not retained:
            return now
        t = fields.get("t")
        if isinstance(t, (int, float)) and fields.get("caps", 0) & codec.CAP_MS:
            t = t / 1000.0
        return float(t) if isinstance(t, (int, float)) and 1e9 < t <= now + 60 else None

    def _set_online(self, d, up):
        self.online += (up is True) - (d.online is True)
        self.offline += (up is False) - (d.online is False)
        d.online = up

    def _device(self, dev):
        d = self.devices.get(dev)
        if d is None:
            d = self.devices[dev] = Device(dev)
            if self.order and dev < self.order[-1]:
                self._sorted = False
            self.order.append(dev)
            self.index_version += 1
        return d

    def _query(self, qid):
        q = self.queries.get(qid)
        if q is None:
            q = self.queries[qid] = Query(qid, self.history)
        return q

    # -- outputs ---------------------------------------------------------------------------------
    def devices_page(self, offset=0, limit=PAGE, q="", status=""):
        """``{"total", "matched", "offset", "limit", "items"}``: devices in id order matching ``q`` (a
        case-insensitive substring of the id or a source name) and ``status`` (online/offline/unknown)."""
        offset = max(0, int(offset))
        limit = max(0, min(int(limit), MAX_LIMIT))
        q = (q or "").strip().lower()
        status = status if status in ("online", "offline", "unknown") else ""
        ids = self._matching(q, status)
        page = ids[offset:offset + limit]
        return {"total": len(self.devices), "matched": len(ids), "offset": offset, "limit": limit, "q": q,
                "status": status, "items": [self.devices[i].row() for i in page]}

    def _matching(self, q, status):
        if not self._sorted:
            self.order.sort()
            self._sorted = True
        if not q and not status:
            return self.order
        key = (q, status, self.index_version, self.devices_version if status else None)
        if self._search[0] == key:
            return self._search[1]
        devs = self.devices
        want = {"online": True, "offline": False, "unknown": None}.get(status)
        ids = [i for i in self.order if (not q or q in devs[i].key) and (not status or devs[i].online is want)]
        self._search = (key, ids)
        return ids

    def device_counts(self):
        return {"total": len(self.devices), "online": self.online, "offline": self.offline,
                "version": self.devices_version}

    def totals(self, provided=None):
        """Messages seen on the broker, and what only the driver knows (``provided``, from its totals
        provider): ``samples`` (what send-everything would have sent), ``deadband`` (an estimate of
        plain deadband's messages), ``ours`` (our messages over the same window, else up + ctl here)."""
        p = dict(provided or {})
        c = self.counts
        ours = p.get("ours")
        if not isinstance(ours, (int, float)):
            ours = c["up"] + c["ctl"]
        samples, deadband = p.get("samples"), p.get("deadband")
        return {"uplink": c["up"], "downlink": c["ctl"], "births_and_wills": c["state"], "answers": c["answer"],
                "bad": c["bad"], "since": self.started, "ours": ours,
                "samples": samples, "deadband": deadband, "window": p.get("window"),
                "saved_vs_samples": 1.0 - ours / samples if isinstance(samples, (int, float)) and samples > 0 else None,
                "vs_deadband": ours / deadband if isinstance(deadband, (int, float)) and deadband > 0 else None,
                "driver": p.get("driver"), "extra": p.get("extra") or {}, "error": p.get("error"),
                "security": p.get("security")}

    def query_rows(self, since=None):
        """Every query, sorted by id; with ``since`` ({id: cursor}, None: no history) each row carries
        its history after that cursor (all of it for an id not in ``since``)."""
        out = []
        stale = presence.stale(self.backend)
        for qid in sorted(self.queries):
            r = self.queries[qid].row(None if since is None else since.get(qid, 0))
            r["stale"] = stale if stale and self.queries[qid].last is not None else None
            out.append(r)
        return out

    def state(self, now, since=None, offset=0, limit=PAGE, q="", status="", provided=None, devices=True):
        """The ``/api/state`` document; ``since``: as ``query_rows`` (None: no histories). ``devices``: include one page of devices (a live event carries
        only the counts and ``devices_version``: the page fetches its rows when they changed)."""
        doc = {"fleet": self.fleet, "now": now, "version": self.version, "backend": self.backend,
               "queries": self.query_rows(since),
               "device_counts": self.device_counts(), "totals": self.totals(provided)}
        if devices:
            page = self.devices_page(offset, limit, q, status)
            doc["devices"] = page.pop("items")
            doc["device_page"] = page
        return strict(doc)
