"""Live coordinator loop: MQTT in and out of a ``backend.host.Host`` (DESIGN.md §3 topics, Olston et al. 2003 §4).

A thin paho-mqtt (2.1, MQTT 3.1.1) adapter, I/O and time only: uplinks on ``qf/<fleet>/d/+/up``,
births/Last Wills on ``.../state`` (with the broker's ``retained`` flag) and query specs on
``qf/<fleet>/q/+/spec`` become ``Host.record`` calls stamped with the wall clock; the host's actions
go to an ``MqttSink``: downlinks on the device's ``ctl`` topic at QoS 1, answers (and spec errors)
retained at QoS 0 as JSON on ``qf/<fleet>/q/<id>/answer`` (provisional) and ``.../final`` (the latest final
answer), a removed query's cleared; the latest of each is published again on every connect (QoS 0 is dropped
while disconnected). One
thread: ``client.loop()`` waits on the socket until the host's next deadline, so callbacks and timers
never run concurrently. The session is persistent, so uplinks queued by the broker while the
coordinator was away (a broker restart, a reconnect) are delivered, not lost. The coordinator's own
state (``backend.live.presence``: online on every connect, its Last Will when it dies, offline when it
stops) tells answer consumers whether its retained answers are current; specs given on the command
line (``--query``) are published retained on their topics, so they run, list and go like any other.
"""
import json
import logging
import os
import socket
import threading
import time

import paho.mqtt.client as mqtt

from backend import host as hostmod
from backend.answers import answer_json, channel, error_record
from backend.live import access, presence
from backend.live.broker import BACKEND_USER
from edge.core import topics

log = logging.getLogger("quietfleet.live")
MAX_WAIT = 0.2          # longest single socket wait: stop requests and reconnects are handled promptly
STATUS_EVERY = 1.0      # s between two writes of the status file
RETRY = (0.2, 2.0)      # reconnect delay: first, cap (doubling)


class MqttSink:
    """Where the host's actions go (``host.dispatch``): the broker, plus the optional answer list/file."""

    def __init__(self, live):
        self.live = live
        self.latest = {}        # (query, channel) -> its latest answer payload (b"": cleared), sent again on connect

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
        # a spec waiting for its sources is a state, not a failure: it registers when they are born
        (log.info if message.startswith(hostmod.WAITING) else log.error)("query %s: %s", qid, message)
        self._publish(qid, answer_json(error_record(qid, message, self.live.host.now)))

    def retract(self, qid):
        for ch in ("answer", "final"):
            self.latest[(qid, ch)] = b""
            self.live.client.publish(topics.query(self.live.fleet, qid, ch), b"", qos=0, retain=True)

    def _publish(self, qid, text, ch="answer"):
        live = self.live
        if live.out is not None:
            live.out.write(text + "\n")
        self.latest[(qid, ch)] = text
        live.client.publish(topics.query(live.fleet, qid, ch), text, qos=0, retain=True)

    def republish(self):
        """Every query's latest answer again: paho drops QoS 0 messages while disconnected, and answers made
        then (before the first connect, or degraded during a broker outage) must still reach the topic."""
        for (qid, ch), text in sorted(self.latest.items()):
            self.live.client.publish(topics.query(self.live.fleet, qid, ch), text, qos=0, retain=True)


class LiveCoordinator:
    """Run ``host`` (a ``backend.host.Host``) against the broker at ``address:port`` for ``fleet``
    until ``stop()``.

    ``queries``: specs (dicts with an ``id``) registered at start, as if published on their topics;
    ``answers``: optional list that receives every answer change dict (tests read it);
    ``answers_path``: optional JSONL file, one line per change. ``clock`` is the wall clock shared
    with the devices (their reports carry device time). ``tls``: None or ``{"ca", "cert", "key"}``
    (``backend.live.access``); ``announce``: specs to publish retained on their topics at the first
    connect (``--query``: they come back as spec messages).
    """

    def __init__(self, host, fleet, address, port, password, user=BACKEND_USER, queries=(), clock=time.time,
                 answers=None, answers_path=None, tls=None, client_id=None, announce=(), status_path=None):
        self.host = host
        self.status_path = status_path
        self._status_at = 0.0
        self.fleet = fleet
        self.clock = clock
        self.answers = answers
        self.out = open(answers_path, "a", buffering=1) if answers_path else None
        self.pending = list(queries)
        self.sink = MqttSink(self)
        self.stopping = threading.Event()
        self.connected = False
        self.stats = {"uplinks": 0, "downlinks": 0, "answers": 0, "dropped_down": 0, "errors": 0}
        self.access = access.Access(address, port, user, password, tls, client_id, fleet)
        self.client_id = client_id or "qf-%s-coordinator" % fleet
        self.announce = list(announce)
        self.refused = None         # why the broker refused our login, if it did
        self.linked = False         # connected at least once
        self.since = None           # wall-clock start of this run (the online state says it)
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                        protocol=mqtt.MQTTv311, clean_session=False)
        access.configure(c, user, password, tls)
        presence.will(c, fleet, "coordinator", self.client_id)
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
            self.refused = str(reason)
            log.error(access.refused(self.access, reason))
            return
        self.connected = self.linked = True
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe([(topics.device(self.fleet, "+", "up"), 1), (topics.device(self.fleet, "+", "state"), 1),
                          (topics.query(self.fleet, "+", "spec"), 1)])
        client.publish(topics.backend(self.fleet), presence.online(
            "coordinator", self.host.settings["protocol"], self.coord.protocol.kinds, self.since, self.client_id),
            qos=presence.QOS, retain=True)
        for spec in self.announce:          # once: a spec published again would be applied again
            body = {k: v for k, v in spec.items() if k != "id"}
            client.publish(topics.query(self.fleet, spec["id"], "spec"), json.dumps(body), qos=1, retain=True)
        self.announce = []
        self.sink.republish()
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
        if t is None or t[0] != self.fleet or t[1] not in ("d", "q") or t[3] not in ("up", "state", "spec"):
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
        for line in self.host.alerts():     # refused sources, floods, bad input: while it happens
            log.warning(line)

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
        now = self.since = self.clock()
        self._act(self.host.incarnation, now, hostmod.new_incarnation(now))
        self.start_queries(now)
        retry_at, backoff = 0.0, RETRY[0]
        while not self.stopping.is_set():
            if self.refused and not self.linked:
                break               # a wrong login, not a broker restart: the caller says so
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
                    except (OSError, ValueError) as e:
                        log.warning(access.unreachable(self.access, e))
                if self.client.socket() is None:
                    self.stopping.wait(max(wait, 0.01))
                    continue
            if self.client.loop(timeout=wait) != mqtt.MQTT_ERR_SUCCESS:
                self.connected = False
            elif self.connected:
                backoff = RETRY[0]
            self.write_status()
        self._status_at = 0.0
        self.write_status()
        self.close()
        return self.counters()

    def counters(self):
        d = hostmod.digest(self.host, sources=False, queries=False)
        return dict(self.stats, host=dict(self.host.stats), coordinator=d["stats"], offenders=d["offenders"],
                    in_quarantine=d["in_quarantine"], contested=d["contested"])

    def write_status(self):
        """``status_path`` (if given) replaced by the counters (``counters``), at most every ``STATUS_EVERY`` s."""
        now = time.monotonic()
        if self.status_path is None or now < self._status_at:
            return
        self._status_at = now + STATUS_EVERY
        with open(self.status_path + ".tmp", "w") as f:
            json.dump(dict(self.counters(), time=self.clock()), f, default=str)
        os.replace(self.status_path + ".tmp", self.status_path)

    def close(self):
        try:
            if self.connected:      # a clean disconnect sends no Will: say it ourselves
                info = self.client.publish(topics.backend(self.fleet), presence.offline(
                    "coordinator", "stopped", self.clock(), self.client_id), qos=presence.QOS, retain=True)
                deadline = time.monotonic() + 2.0
                while not info.is_published() and time.monotonic() < deadline and self.client.socket() is not None:
                    self.client.loop(timeout=0.1)
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
    """``quietfleet coordinator``: run the live coordinator for a broker (``backend.live.access``: the
    credentials of ``quietfleet broker`` or your own broker's address, login and TLS) until Ctrl-C;
    queries from ``--query`` JSON strings (published retained on their topics) and topics
    ``qf/<fleet>/q/<id>/spec``."""
    import signal
    import sys
    from backend.live.queryctl import check_spec
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        acc = access.from_args(args)
        settings = hostmod.from_args(args)
        kinds = hostmod.build(settings).protocol.kinds      # a bad protocol is refused here, before connecting
        specs = []
        for q in args.query or []:
            try:
                spec = json.loads(q)
            except ValueError as e:
                raise ValueError("--query %s is not JSON: %s" % (q, e))
            if not isinstance(spec, dict) or not isinstance(spec.get("id"), str) or not spec["id"]:
                raise ValueError("--query %s needs an \"id\" (a non-empty string)" % q)
            specs.append(dict(check_spec(spec["id"], spec, kinds, settings["protocol"]), id=spec["id"]))
        # the registry: sources provisioned per device in the credentials file (quietfleet broker --source)
        host = hostmod.Host(hostmod.settings(settings, registry=acc.registry), t0=time.time())
        live = LiveCoordinator(host, acc.fleet, acc.host, acc.port, acc.password, user=acc.user, queries=specs,
                               answers_path=args.answers, tls=acc.tls, client_id=acc.client_id, announce=specs,
                               status_path=getattr(args, "status", None))
        from backend.ui import hooks as ui_hooks        # --ui: the dashboard (backend/ui)
        ui = ui_hooks.coordinator(args, live, acc, specs)       # --ui
    except KeyError as e:
        print("quietfleet coordinator: %s lacks %s (write it with quietfleet broker)"
              % (args.credentials or os.path.join(args.broker_dir, "credentials.json"), e), file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:      # QueryError is a ValueError
        print("quietfleet coordinator: %s" % e, file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM stop the loop at its next turn (at most MAX_WAIT): a KeyboardInterrupt raised
    # inside paho (say, mid-reconnect to a broker that is gone) could leave the client unable to close
    signal.signal(signal.SIGTERM, lambda *_: live.stop())
    signal.signal(signal.SIGINT, lambda *_: live.stop())
    print("coordinator for fleet %s on %s (%s); answers on %s, its state on %s" % (
        acc.fleet, acc.where(), host.settings["protocol"], topics.query(acc.fleet, "<id>", "answer"),
        topics.backend(acc.fleet)), flush=True)
    stats = live.run()
    if ui is not None:      # --ui
        ui.stop()           # --ui
    if live.refused and not live.linked:
        print("quietfleet coordinator: %s" % access.refused(acc, live.refused), file=sys.stderr)
        return 2
    print(json.dumps({"stats": stats}))
    return 0
