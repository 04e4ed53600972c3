"""Live coordinator loop: MQTT in and out of the sans-IO Coordinator (DESIGN.md §3 topics, Olston et al. 2003 §4).

A thin paho-mqtt (2.1, MQTT 3.1.1) adapter for tests and small setups: uplinks on
``qf/<fleet>/d/+/up`` and births/Last Wills on ``.../state`` (with the broker's ``retained`` flag) go
to ``Coordinator.handle_uplink``; ``("down", device, payload)`` actions leave on the device's ``ctl``
topic at QoS 1; answers are published retained at QoS 0 on ``qf/<fleet>/q/<id>/answer`` as JSON;
query specs arrive retained on ``qf/<fleet>/q/<id>/spec`` (an empty payload removes the query). One
thread: ``client.loop()`` waits on the socket until the coordinator's next deadline, so callbacks and
timers never run concurrently. The session is persistent, so uplinks queued by the broker while the
coordinator was away (a broker restart, a reconnect) are delivered, not lost.
"""
import json
import logging
import socket
import threading
import time

import paho.mqtt.client as mqtt

from backend.broker import BACKEND_USER

log = logging.getLogger("quietfleet.live")
MAX_WAIT = 0.2          # longest single socket wait: stop requests and reconnects are handled promptly
RETRY = (0.2, 2.0)      # reconnect delay: first, cap (doubling)


def answer_json(change):
    """The JSON text of one answer change, with its guarantee spelled out (as the simulator writes it)."""
    line = dict(change)
    line["guarantee"] = "degraded" if change.get("degraded") else "interval"
    return json.dumps(line)


class LiveCoordinator:
    """Run ``coord`` against the broker at ``host:port`` for ``fleet`` until ``stop()``.

    ``answers``: optional list that receives every answer change dict (tests read it);
    ``answers_path``: optional JSONL file, one line per change. ``clock`` is the wall clock shared
    with the devices (their reports carry device time).
    """

    def __init__(self, coord, fleet, host, port, password, user=BACKEND_USER, queries=(), clock=time.time,
                 answers=None, answers_path=None, ca=None, client_id=None):
        self.coord = coord
        self.fleet = fleet
        self.clock = clock
        self.base = "qf/%s/" % fleet
        self.answers = answers
        self.out = open(answers_path, "a", buffering=1) if answers_path else None
        self.pending = list(queries)
        self.stopping = threading.Event()
        self.connected = False
        self.lost = False
        self.stats = {"uplinks": 0, "downlinks": 0, "answers": 0, "bad_specs": 0, "dropped_down": 0, "errors": 0}
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "qf-%s-coordinator" % fleet,
                        protocol=mqtt.MQTTv311, clean_session=False)
        c.username_pw_set(user, password)
        if ca:
            c.tls_set(ca_certs=ca)
        c.reconnect_delay_set(0.1, 2.0)
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.connect_async(host, port, keepalive=10)
        self.client = c

    # -- MQTT callbacks ----------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            log.error("broker refused the coordinator: %s", reason)
            return
        self.connected = True
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe([(self.base + "d/+/up", 1), (self.base + "d/+/state", 1), (self.base + "q/+/spec", 1)])
        if self.lost:
            self.lost = False
            self._act(self.coord.link_restored(self.clock()))

    def _on_disconnect(self, client, userdata, flags, reason, properties):
        if self.connected and not self.stopping.is_set():
            log.warning("coordinator disconnected: %s", reason)
            self.lost = True      # blind until reconnected: answers degraded, births requested after
            self._act(self.coord.link_lost(self.clock()))
        self.connected = False

    def _on_message(self, client, userdata, msg):
        now = self.clock()
        parts = msg.topic.split("/")
        if len(parts) != 5 or parts[0] != "qf" or parts[1] != self.fleet:
            return
        try:
            if parts[2] == "d" and parts[4] in ("up", "state"):
                self.stats["uplinks"] += 1
                self._act(self.coord.handle_uplink(now, parts[3], msg.payload, retained=bool(msg.retain)))
            elif parts[2] == "q" and parts[4] == "spec":
                self._spec(now, parts[3], msg.payload)
        except Exception:           # a bug must not take the fleet's coordinator down: log, count, go on
            self.stats["errors"] += 1
            log.exception("message on %s failed", msg.topic)

    def _event_time(self, now):
        """Query changes take effect at event time ``now - λ`` (as a Last Will does), never before the
        coordinator's clock, so answers stay in time order."""
        return max(self.coord.clock, now - self.coord.latency)

    def _spec(self, now, qid, payload):
        now = self._event_time(now)
        try:
            if not payload:
                if qid in self.coord.queries:
                    self._act(self.coord.remove_query(qid, now))
                return
            spec = json.loads(payload)
            if not isinstance(spec, dict):
                raise ValueError("a query spec must be a JSON object")
            spec["id"] = qid
            if qid in self.coord.queries:
                self._act(self.coord.remove_query(qid, now))
            self._act(self.coord.add_query(spec, now))
        except ValueError as e:      # bad JSON or QueryError: log it, keep running
            self.stats["bad_specs"] += 1
            log.error("query %s rejected: %s", qid, e)

    # -- actions -------------------------------------------------------------------------------
    def _act(self, actions):
        for a in actions:
            if a[0] == "down":
                info = self.client.publish(self.base + "d/%s/ctl" % a[1], a[2], qos=1)
                if info.rc == mqtt.MQTT_ERR_SUCCESS:
                    self.stats["downlinks"] += 1
                else:
                    self.stats["dropped_down"] += 1   # disconnected: the device resyncs by its birth
            else:
                change = a[1]
                self.stats["answers"] += 1
                if self.answers is not None:
                    self.answers.append(change)
                text = answer_json(change)
                if self.out is not None:
                    self.out.write(text + "\n")
                self.client.publish(self.base + "q/%s/answer" % change["query"], text, qos=0, retain=True)

    # -- loop ----------------------------------------------------------------------------------
    def stop(self):
        self.stopping.set()

    def run(self):
        """Loop until ``stop()``; returns the counters."""
        for spec in self.pending:
            try:
                self._act(self.coord.add_query(spec, self._event_time(self.clock())))
            except ValueError as e:     # QueryError: say so and keep serving the other queries
                self.stats["bad_specs"] += 1
                log.error("query %s rejected: %s", spec.get("id") if isinstance(spec, dict) else spec, e)
        self.pending = []
        retry_at, backoff = 0.0, RETRY[0]
        while not self.stopping.is_set():
            now = self.clock()
            deadline = self.coord.next_deadline()
            if deadline <= now:
                self._act(self.coord.handle_timer(now))
                deadline = self.coord.next_deadline()
            wait = min(max(deadline - self.clock(), 0.0), MAX_WAIT)
            if self.client.socket() is None:
                if now >= retry_at:
                    retry_at, backoff = now + backoff, min(backoff * 2, RETRY[1])
                    try:
                        self.client.reconnect()
                    except OSError as e:
                        log.warning("broker unreachable: %s", e)
                if self.client.socket() is None:
                    self.stopping.wait(max(wait, 0.01))
                    continue
            if self.client.loop(timeout=wait) != mqtt.MQTT_ERR_SUCCESS:
                self.connected = False
            elif self.connected:
                backoff = RETRY[0]
        self.close()
        return dict(self.stats, coordinator=dict(self.coord.stats))

    def close(self):
        try:
            self.client.disconnect()
        except Exception:       # never connected: nothing to say goodbye to
            pass
        if self.out is not None:
            self.out.close()
            self.out = None

    def start_thread(self):
        """Run in a daemon thread (tests); ``stop()`` then ``thread.join()``."""
        t = threading.Thread(target=self.run, name="qf-coordinator", daemon=True)
        t.start()
        return t


def coordinator_main(args):
    """``quietfleet coordinator``: run the live coordinator for the broker described by a credentials
    file (written by ``quietfleet broker``/``fleet``) until Ctrl-C; queries from ``--query`` JSON
    strings and/or topics ``qf/<fleet>/q/<id>/spec``."""
    import signal
    import sys
    from backend.coordinator.core.coordinator import Coordinator
    from backend.coordinator.protocols import make
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with open(args.credentials) as f:
            cred = json.load(f)
        specs = [json.loads(q) for q in args.query or []]
        protocol = make(args.protocol)
        coord = Coordinator(protocol, period=args.period, shrink=args.shrink if protocol.shrinks else 0.0,
                            latency=args.latency, beat=args.beat, t0=time.time())
        coord.declare_sources([src for q in specs if isinstance(q, dict) and isinstance(q.get("sources"), list)
                               for src in q["sources"]])
        live = LiveCoordinator(coord, cred["fleet"], cred["host"], cred["port"], cred["users"][BACKEND_USER],
                               queries=specs, answers_path=args.answers)
    except (OSError, ValueError, KeyError) as e:
        print("quietfleet coordinator: %s" % e, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: live.stop())
    print("coordinator for fleet %s on %s:%d (%s); answers on qf/%s/q/<id>/answer" % (
        cred["fleet"], cred["host"], cred["port"], args.protocol, cred["fleet"]), flush=True)
    try:
        stats = live.run()
    except KeyboardInterrupt:
        live.close()
        stats = dict(live.stats, coordinator=dict(coord.stats))
    print(json.dumps({"stats": stats}))
    return 0
