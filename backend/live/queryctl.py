"""``quietfleet query add|list|remove``: continuous queries as retained specs on ``qf/<fleet>/q/<id>/spec`` (DESIGN.md §3).

A spec is the JSON of a workload query without its ``id`` (the topic names it), e.g.
``quietfleet query add mean '{"kind": "avg", "sources": ["t0", "t1"], "precision": 0.5}' --broker-dir broker``.
What the command says matches what runs, because it reads what the broker holds first: the retained
specs (the coordinator's ``--query`` specs are published there too), their retained answers and the
backend's state (``backend.live.presence``).

* ``add`` checks the spec as the coordinator will (``parse_query`` with the kinds the running backend's
  protocol answers, all kinds if none runs), says whether it registers or replaces a query (an identical
  spec changes nothing), publishes it and, while a backend runs, waits for its first answer; a spec the
  backend refuses is withdrawn and the command fails.
* ``remove`` of an id that has no spec fails naming the ids there are; otherwise it publishes the empty
  retained spec and, while a backend runs, waits until the answer is cleared.
* ``list`` shows the backend's state and every query with its latest answer, marked ``STALE`` while the
  backend is offline (its last answers stay retained but nobody keeps them true).
"""
import json
import queue
import sys
import time

from backend.coordinator.core.queries import QueryError, parse_query
from backend.coordinator.protocols import PROTOCOLS
from backend.host import WAITING
from backend.live import access, presence
from edge.core import topics

QUIET = 0.3         # s without a retained message after the subscription: the broker sent them all
LONGEST = 5.0       # s at most to read what is retained


def check_spec(qid, spec, kinds=None, protocol=None):
    """The spec (dict or JSON text) as a dict without ``id``, validated like the coordinator does except for
    which sources exist; ``kinds``: what the running protocol answers (None: any protocol's)."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise QueryError("spec is not JSON: %s" % e)
    if not isinstance(spec, dict):
        raise QueryError("spec must be a JSON object")
    spec = {k: v for k, v in spec.items() if k != "id"}
    srcs = spec.get("sources", "all")
    all_kinds = sorted({k for cls in PROTOCOLS.values() for k in cls.kinds})
    try:
        parse_query(dict(spec, id=qid), set(srcs) if isinstance(srcs, list) and all(isinstance(s, str) for s in srcs)
                    else {"x"}, kinds=sorted(kinds) if kinds is not None else all_kinds)
    except QueryError as e:
        if kinds is not None and spec.get("kind") in all_kinds:
            raise QueryError("%s (the backend runs protocol %s; another protocol answers %r)"
                             % (e, protocol, spec.get("kind")))
        raise
    return spec


class Session:
    """A short MQTT session as ``acc`` (``backend.live.access.Access``) that reads the fleet's retained query
    state: ``specs``, ``answers`` ({id: decoded JSON}) and ``backend`` (its state, or None)."""

    def __init__(self, acc, timeout=10.0):
        self.acc, self.fleet = acc, acc.fleet
        self.specs, self.answers, self.backend = {}, {}, None
        self.events = queue.Queue()
        c = acc.client(acc.id_for("qf-query-%d" % time.monotonic_ns()))
        c.on_connect = lambda cl, u, f, rc, p: self.events.put(("connack", rc))
        c.on_subscribe = lambda cl, u, mid, rcs, p: self.events.put(("suback", [r.is_failure for r in rcs]))
        c.on_disconnect = lambda cl, u, f, rc, p: self.events.put(("gone", rc))
        c.on_message = self._message
        try:
            c.connect(acc.host, acc.port, keepalive=10)
        except (OSError, ValueError) as e:        # refused, unknown host, TLS handshake or certificate
            raise ConnectionError(access.unreachable(acc, e))
        c.loop_start()
        self.client = c
        rc = self._event("connack", timeout)
        if rc.is_failure:
            self.close()
            raise ConnectionError(access.refused(acc, rc))

    def _event(self, kind, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.events.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.close()
                raise ConnectionError("the broker at %s did not answer within %.0fs" % (self.acc.where(), timeout))
            if got[0] == kind:
                return got[1]
            if got[0] == "gone":
                self.close()
                raise ConnectionError("the broker at %s closed the connection of user %s: %s (a client certificate "
                                      "it wants, or TLS settings it refuses?)" % (self.acc.where(), self.acc.user, got[1]))

    def _message(self, cl, u, m):
        t = topics.parse(m.topic)
        if t is None or t[0] != self.fleet:
            return
        if t[1] == "backend":
            self.backend = presence.parse(m.payload)
        elif t[1] == "q":
            table = self.specs if t[3] == "spec" else self.answers
            if not m.payload:
                table.pop(t[2], None)
            else:
                try:
                    table[t[2]] = json.loads(m.payload)
                except ValueError:
                    table[t[2]] = m.payload.decode(errors="replace")
            if not m.retain:
                self.events.put(("msg", (t[2], t[3], table.get(t[2]))))
        if m.retain:
            self.last_retained = time.monotonic()

    def read(self, qid="+"):
        """Subscribe to query ``qid``'s (or every query's) spec and answer and the backend's state, and
        wait until the broker has sent what it retains."""
        self.last_retained = time.monotonic()
        self.client.subscribe([(topics.query(self.fleet, qid, "spec"), 1), (topics.query(self.fleet, qid, "answer"), 1),
                               (topics.backend(self.fleet), 1)])
        if any(self._event("suback", 10.0)):
            raise ConnectionError("the broker at %s refused user %s a subscription to %s's queries (ACL)"
                                  % (self.acc.where(), self.acc.user, self.fleet))
        start = time.monotonic()
        while time.monotonic() - self.last_retained < QUIET and time.monotonic() - start < LONGEST:
            time.sleep(0.05)
        return self

    def publish(self, qid, payload):
        info = self.client.publish(topics.query(self.fleet, qid, "spec"), payload, qos=1, retain=True)
        info.wait_for_publish(10)
        if not info.is_published():
            raise ConnectionError("the broker at %s did not acknowledge the spec of %s" % (self.acc.where(), qid))

    def next_answer(self, qid, timeout):
        """The next live record on ``qid``'s answer topic within ``timeout`` s: the answer or error dict, {} for a
        cleared answer, None if none came."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, got = self.events.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return None
            if kind == "msg" and got[0] == qid and got[1] == "answer":
                return got[2] if got[2] is not None else {}

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def _backend_line(fleet, state):
    if state is None:
        return "backend: none has announced itself on %s" % topics.backend(fleet)
    what = "%s, protocol %s" % (state.get("driver"), state.get("protocol")) if state.get("protocol") else state.get("driver")
    if state["state"] == "online":
        return "backend: online (%s, since %s)" % (what, _when(state.get("since")))
    return "backend: OFFLINE (%s%s): every answer below is stale" % (
        state.get("reason"), ", since %s" % _when(state["since"]) if state.get("since") else "")


def _when(t):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "?"


def list_queries(s, out=print):
    out(_backend_line(s.fleet, s.backend))
    stale = presence.stale(s.backend)
    for qid in sorted(set(s.specs) | set(s.answers)):
        spec, answer = s.specs.get(qid), s.answers.get(qid)
        out("%s  %s" % (qid, json.dumps(spec, sort_keys=True) if spec is not None
                        else "(no spec: removed while no backend ran; its answer is the last one made)"))
        out("    answer: %s%s" % (json.dumps(answer) if answer is not None else "none yet",
                                  "  [STALE: %s]" % stale if stale and answer is not None else ""))


def add(s, qid, text, wait, out=print):
    """Register or replace ``qid``; returns the exit status."""
    running = s.backend if s.backend and s.backend["state"] == "online" else None
    spec = check_spec(qid, text, running.get("kinds") if running else None, running and running.get("protocol"))
    old = s.specs.get(qid)
    if old == spec:
        out("query %s unchanged: it is registered with this spec" % qid)
        return 0
    s.publish(qid, json.dumps(spec))
    said = "query %s registered%s" % (qid, "" if old is None else ": it replaces the earlier spec %s"
                                      % json.dumps(old, sort_keys=True))
    if running is None:
        out("%s; no backend is running (%s), so it runs when one starts" % (said, _backend_line(s.fleet, s.backend)[9:]))
        return 0
    got = s.next_answer(qid, wait)
    if isinstance(got, dict) and "error" in got and not str(got["error"]).startswith(WAITING):
        s.publish(qid, b"")             # a refused spec does not stay retained to be refused again
        raise QueryError("query %s: refused by the backend: %s (spec withdrawn)" % (qid, got["error"]))
    out(said)
    out("    answer: %s" % (json.dumps(got) if got else "none within %gs (see quietfleet query list)" % wait))
    return 0


def remove(s, qid, wait, out=print):
    if qid not in s.specs:
        raise QueryError("no query %s to remove (registered: %s)" % (qid, ", ".join(sorted(s.specs)) or "none"))
    answered = qid in s.answers
    s.publish(qid, b"")
    if s.backend and s.backend["state"] == "online":
        cleared = not answered or s.next_answer(qid, wait) == {}
        out("query %s removed%s" % (qid, "" if cleared else " (its answer not cleared within %gs)" % wait))
    else:
        out("query %s removed; no backend is running, so its last answer stays until one does" % qid)
    return 0


def query_main(args):
    acc = None
    try:
        acc = access.from_args(args)
        if args.action in ("add", "remove") and not args.id:
            raise ValueError("query %s needs a query id" % args.action)
        text = None
        if args.action == "add":
            text = args.spec if args.spec else sys.stdin.read()
            check_spec(args.id, text)               # refuse a bad spec before connecting
        s = Session(acc).read()
        try:
            if args.action == "add":
                return add(s, args.id, text, args.wait)
            if args.action == "remove":
                return remove(s, args.id, args.wait)
            list_queries(s)
            return 0
        finally:
            s.close()
    except KeyError as e:           # from the broker's credentials.json
        print("quietfleet query: %s lacks %s (write it with quietfleet broker)"
              % (args.credentials or "%s/credentials.json" % args.broker_dir, e), file=sys.stderr)
        return 2
    except (QueryError, ValueError, OSError) as e:     # ConnectionError is an OSError
        print("quietfleet query: %s" % e, file=sys.stderr)
        return 2
