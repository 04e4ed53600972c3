"""Live coordinator loop: MQTT in and out of a ``backend.host.Host`` (DESIGN.md §3 topics, Olston et al. 2003 §4).

A thin paho-mqtt (2.1, MQTT 3.1.1) adapter, I/O and time only: uplinks on ``qf/<fleet>/d/+/up``,
births/Last Wills on ``.../state`` (with the broker's ``retained`` flag) and query specs on
``qf/<fleet>/q/+/spec`` become ``Host.record`` calls stamped with the wall clock; the host's actions
go to an ``MqttSink``: downlinks on the device's ``ctl`` topic at QoS 1, answers (and spec errors)
retained at QoS 0 as JSON on ``qf/<fleet>/q/<id>/answer`` (provisional) and ``.../final`` (the latest final
answer), a removed query's cleared. One
thread: ``client.loop()`` waits on the socket until the host's next deadline, so callbacks and timers
never run concurrently. The session is persistent, so uplinks queued by the broker while the
coordinator was away (a broker restart, a reconnect) are delivered, not lost.
"""
import json
import logging
import socket
import threading
import time

import paho.mqtt.client as mqtt

from backend import host as hostmod
from backend.answers import answer_json, channel, error_record
from backend.live.broker import BACKEND_USER
from edge.core import topics

log = logging.getLogger("quietfleet.live")
MAX_WAIT = 0.2          # longest single socket wait: stop requests and reconnects are handled promptly
RETRY = (0.2, 2.0)      # reconnect delay: first, cap (doubling)


class MqttSink:
    """Where the host's actions go (``host.dispatch``): the broker, plus the optional answer list/file."""

    def __init__(self, live):
        self.live = live

    def down(self, device, payload):
        live = self.live
        info = live.client.publish(topics.device(live.fleet, device, "ctl"), payload, qos=1)
        if info.rc == mqtt.MQTT_ERR_SUCCESS:
            live.stats["downlinks"] += 1
        else:
            live.stats["dropped_down"] += 1   # disconnected: the device resyncs by its birth

    def answer(self, change):
        live = self.live
        live.stats["answers"] += 1
        if live.answers is not None:
            live.answers.append(change)
        self._publish(change["query"], answer_json(change), channel(change))

    def error(self, qid, message):
        log.error("query %s: %s", qid, message)
        self._publish(qid, answer_json(error_record(qid, message, self.live.host.now)))

    def retract(self, qid):
        for ch in ("answer", "final"):
            self.live.client.publish(topics.query(self.live.fleet, qid, ch), b"", qos=0, retain=True)

    def _publish(self, qid, text, ch="answer"):
        live = self.live
        if live.out is not None:
            live.out.write(text + "\n")
        live.client.publish(topics.query(live.fleet, qid, ch), text, qos=0, retain=True)


class LiveCoordinator:
    """Run ``host`` (a ``backend.host.Host``) against the broker at ``address:port`` for ``fleet``
    until ``stop()``.

    ``queries``: specs (dicts with an ``id``) registered at start, as if published on their topics;
    ``answers``: optional list that receives every answer change dict (tests read it);
    ``answers_path``: optional JSONL file, one line per change. ``clock`` is the wall clock shared
    with the devices (their reports carry device time).
    """

    def __init__(self, host, fleet, address, port, password, user=BACKEND_USER, queries=(), clock=time.time,
                 answers=None, answers_path=None, ca=None, client_id=None):
        self.host = host
        self.fleet = fleet
        self.clock = clock
        self.answers = answers
        self.out = open(answers_path, "a", buffering=1) if answers_path else None
        self.pending = list(queries)
        self.sink = MqttSink(self)
        self.stopping = threading.Event()
        self.connected = False
        self.stats = {"uplinks": 0, "downlinks": 0, "answers": 0, "dropped_down": 0, "errors": 0}
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
        c.connect_async(address, port, keepalive=10)
        self.client = c

    @property
    def coord(self):
        return self.host.coord

    # -- MQTT callbacks ----------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            log.error("broker refused the coordinator: %s", reason)
            return
        self.connected = True
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe([(topics.device(self.fleet, "+", "up"), 1), (topics.device(self.fleet, "+", "state"), 1),
                          (topics.query(self.fleet, "+", "spec"), 1)])
        self._act(self.host.link_restored, self.clock())     # births requested if the link was lost

    def _on_disconnect(self, client, userdata, flags, reason, properties):
        if self.connected and not self.stopping.is_set():
            log.warning("coordinator disconnected: %s", reason)
            self._act(self.host.link_lost, self.clock())     # blind until reconnected: answers degrade
        self.connected = False

    def _on_message(self, client, userdata, msg):
        self.message(self.clock(), msg.topic, msg.payload, msg.retain)

    def message(self, now, topic, payload, retained=False):
        """One broker message at wall-clock time ``now`` (the replay tests call this directly)."""
        t = topics.parse(topic)
        if t is None or t[0] != self.fleet or t[3] not in ("up", "state", "spec"):
            return
        if t[1] == "d":
            self.stats["uplinks"] += 1
        self._act(self.host.record, now, t[2], t[3], payload, bool(retained))

    def timer(self, now):
        """The host's deadline passed (the loop calls this; so do the replay tests)."""
        self._act(self.host.timer, now)

    def _act(self, call, *args):
        try:
            hostmod.dispatch(call(*args), self.sink)
        except Exception:           # a bug must not take the fleet's coordinator down: log, count, go on
            self.stats["errors"] += 1
            log.exception("%s%r failed", getattr(call, "__name__", call), args[:3])

    def start_queries(self, now):
        """Register the ``queries`` given at construction (``run`` does this first)."""
        for spec in self.pending:
            self._act(self.host.spec, now, spec.get("id") if isinstance(spec, dict) else None, spec)
        self.pending = []

    # -- loop ----------------------------------------------------------------------------------
    def stop(self):
        self.stopping.set()

    def run(self):
        """Loop until ``stop()``; returns the counters. Each run is a new backend incarnation."""
        now = self.clock()
        self._act(self.host.incarnation, now, hostmod.new_incarnation(now))
        self.start_queries(now)
        retry_at, backoff = 0.0, RETRY[0]
        while not self.stopping.is_set():
            now = self.clock()
            deadline = self.host.next_deadline()
            if deadline <= now:
                self.timer(now)
                deadline = self.host.next_deadline()
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
        return self.counters()

    def counters(self):
        return dict(self.stats, host=dict(self.host.stats), coordinator=dict(self.coord.stats))

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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with open(args.credentials) as f:
            cred = json.load(f)
        specs = []
        for q in args.query or []:
            try:
                specs.append(json.loads(q))
            except ValueError as e:
                raise ValueError("--query %s is not JSON: %s" % (q, e))
        host = hostmod.Host(hostmod.from_args(args), t0=time.time())
        live = LiveCoordinator(host, cred["fleet"], cred["host"], cred["port"], cred["users"][BACKEND_USER],
                               queries=specs, answers_path=args.answers)
        from backend.ui import hooks as ui_hooks        # --ui: the dashboard (backend/ui)
        ui = ui_hooks.coordinator(args, live, cred["fleet"], cred["host"], cred["port"],       # --ui
                                  cred["users"][BACKEND_USER], specs)                          # --ui
    except KeyError as e:
        print("quietfleet coordinator: %s lacks %s (write it with quietfleet broker)" % (args.credentials, e),
              file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print("quietfleet coordinator: %s" % e, file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM stop the loop at its next turn (at most MAX_WAIT): a KeyboardInterrupt raised
    # inside paho (say, mid-reconnect to a broker that is gone) could leave the client unable to close
    signal.signal(signal.SIGTERM, lambda *_: live.stop())
    signal.signal(signal.SIGINT, lambda *_: live.stop())
    print("coordinator for fleet %s on %s:%d (%s); answers on %s" % (cred["fleet"], cred["host"], cred["port"],
          host.settings["protocol"], topics.query(cred["fleet"], "<id>", "answer")), flush=True)
    stats = live.run()
    if ui is not None:      # --ui
        ui.stop()           # --ui
    print(json.dumps({"stats": stats}))
    return 0
