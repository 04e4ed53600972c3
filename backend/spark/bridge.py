"""MQTT -> spool (or Kafka) bridge: persistent session, QoS 1, acknowledge only after the append (DESIGN.md §6 Ingest).

``spool`` is a ``Spool`` or, for ``--ingest kafka``, a ``kafkalog.KafkaLog`` (same ``append``, which returns
once Kafka acknowledged every record: a message is acknowledged to MQTT only after Kafka has it).

The bridge connects as the ``backend`` user with a fixed client id and ``clean_session=False``,
so the broker queues QoS 1 messages while it is away. paho-mqtt 2.1 runs with ``manual_ack=True``:
a PUBACK is sent only after the message's batch was appended to the spool (and fsynced, with the
spool's ``fsync="always"``), so a message the broker considers delivered is never lost. The price
is at-least-once: a crash between append and PUBACK makes the broker redeliver, and the Spark job
removes such duplicates by (device, sequence number). Acks carry the connection generation they
were received on and are not sent on a later connection, where the packet id may have been
reused. Payloads are spooled undecoded (malformed ones too: the job counts them); a message too
large for a spool record is acknowledged and counted as dropped.

Some records carry more than the MQTT message: a message the broker delivered as retained (a stale
birth or Last Will, or a query spec) is spooled under its topic plus ``RETAINED`` (``#`` cannot occur
in a published topic); while idle for ``tick_seconds`` the bridge appends a ``qf/<fleet>/tick``
record, so the passing of time is part of the spool and the job replays it identically after a
restart. The broker link is part of the spool too, as the live coordinator sees it: when the
connection drops (not by ``stop``) the bridge appends ``qf/<fleet>/link`` ``lost`` (after every
message received before it) and keeps ticking while away, so the job's clock advances and its
answers degrade (``Host.link_lost``); once subscribed again it appends ``restored`` (births are
requested). The bridge subscribes only to device and query topics, so no client can forge these.
It also spools every downlink (``ctl``) as the broker passes it on: the job's controls leave only
after its batch, and the coordinator times a control's round trip from that echo (echo mode).
"""
import logging
import threading
import time

import paho.mqtt.client as mqtt

from backend.live.access import configure
from backend.spark.spool import MAX_RECORD
from backend.spark.source import RETAINED
from edge.core import topics

log = logging.getLogger("quietfleet.bridge")

_OVERHEAD = 64   # bound on a spool record's bytes besides topic and payload


def username_of(client):
    name = client._username
    return name.decode(errors="replace") if isinstance(name, bytes) else name


def subscriptions(fleet):
    """The topic filters the bridge subscribes to, all at QoS 1."""
    return [(topics.device(fleet, "+", "up"), 1), (topics.device(fleet, "+", "state"), 1),
            (topics.device(fleet, "+", "ctl"), 1),
            (topics.query(fleet, "+", "spec"), 1)]


class Bridge:
    """Subscribe to a fleet's uplink, state, control and query-spec topics and append every message to ``spool``.

    Messages are appended in batches of at most ``batch_messages``, at most ``batch_seconds``
    after the first one of the batch arrived. ``start()`` returns at once (the broker may still be
    down; paho reconnects); ``subscribed`` is set once the subscription is in place.
    """

    def __init__(self, spool, fleet, host="127.0.0.1", port=1883, username="backend", password=None,
                 client_id=None, batch_messages=1000, batch_seconds=0.005, keepalive=30, tick_seconds=None, tls=None):
        self.spool = spool
        self.fleet = fleet
        self.host, self.port, self.keepalive = host, port, keepalive
        self.batch_messages = batch_messages
        self.batch_seconds = batch_seconds
        self.tick_seconds = tick_seconds
        self.tick_topic = topics.tick(fleet)
        self.link_topic = topics.spool(fleet, "link")
        self.sent_topic = topics.spool(fleet, "sent")
        self.lost = False        # the link dropped while subscribed and is not restored yet
        self.subscribed = threading.Event()
        self.stats = {"received": 0, "spooled": 0, "acked": 0, "oversized": 0, "batches": 0,
                      "spool_errors": 0, "connects": 0, "resumed_sessions": 0, "ticks": 0,
                      "links_lost": 0}
        self._cv = threading.Condition()
        self._pending = []       # (arrival, topic, payload or None if dropped, mid, qos, generation)
        self._since = 0.0        # monotonic time the first pending message arrived
        self._generation = 0     # bumped on every connect and disconnect
        self._stopping = False
        self._flusher = None
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "qf-bridge-" + fleet,
                                  clean_session=False, protocol=mqtt.MQTTv311, manual_ack=True)
        configure(self.client, username or None, password, tls)     # tls: backend.live.access
        self.client.reconnect_delay_set(min_delay=0.2, max_delay=5)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        self._stopping = False
        self._pending = []   # left over from a stop: never acknowledged, so the broker redelivers them
        self._flusher = threading.Thread(target=self._flush_loop, name="qf-bridge-flush", daemon=True)
        self._flusher.start()
        self.client.connect_async(self.host, self.port, keepalive=self.keepalive)
        self.client.loop_start()
        return self

    def stop(self, timeout=10.0):
        """Append and acknowledge what has arrived, then disconnect (the broker keeps the session)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._flusher is not None:
            self._flusher.join(timeout)
        self.client.disconnect()
        self.client.loop_stop()
        self.subscribed.clear()

    # -- paho callbacks (network thread; must never raise) -----------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.warning("bridge: the broker at %s:%s refused user %s: %s", self.host, self.port, username_of(client),
                        reason_code)
            return
        with self._cv:
            self._generation += 1
        self.stats["connects"] += 1
        if flags.session_present:
            # The broker kept our subscriptions; subscribing again would replay retained messages.
            self.stats["resumed_sessions"] += 1
            self._linked()
        else:
            client.subscribe(subscriptions(self.fleet))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        with self._cv:
            self._generation += 1
            if self.subscribed.is_set() and not self._stopping:
                self.lost = True
                self.stats["links_lost"] += 1
                self._enqueue(self.link_topic, b"lost")
        self.subscribed.clear()
        if reason_code.is_failure:
            log.warning("bridge: connection lost (%s); reconnecting", reason_code)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        if any(rc.is_failure for rc in reason_codes):
            log.error("bridge: subscription refused: %s", [str(rc) for rc in reason_codes])
            return
        self._linked()

    def _linked(self):
        """Subscribed (again): after a lost link, a ``restored`` record."""
        with self._cv:
            if self.lost:
                self.lost = False
                self._enqueue(self.link_topic, b"restored")
        self.subscribed.set()

    def _enqueue(self, topic, payload, mid=None, qos=0):
        """A record for the flusher (``_cv`` held); ``mid``/``qos`` of an MQTT message to acknowledge."""
        if not self._pending:
            self._since = time.monotonic()
        self._pending.append((time.time(), topic, payload, mid, qos, self._generation))
        if len(self._pending) in (1, self.batch_messages):
            self._cv.notify()

    def _on_message(self, client, userdata, msg):
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = msg._topic.decode("utf-8", "replace")
        if msg.retain:
            topic += RETAINED
        payload = msg.payload
        if len(payload) + len(topic.encode()) + _OVERHEAD > MAX_RECORD:
            payload = None
        with self._cv:
            self.stats["received"] += 1
            self._enqueue(topic, payload, msg.mid, msg.qos)

    # -- flushing (own thread) ------------------------------------------------------------------------
    def _flush_loop(self):
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: self._pending or self._stopping, timeout=self.tick_seconds):
                    if self.subscribed.is_set() or self.lost:
                        self._tick()
                    if not self._pending:
                        continue
                if not self._stopping:
                    left = self._since + self.batch_seconds - time.monotonic()
                    self._cv.wait_for(lambda: len(self._pending) >= self.batch_messages or self._stopping,
                                      timeout=max(0.0, left))
                batch, self._pending = self._pending, []
            if batch and not self._append(batch):
                return
            if self._stopping and not batch:
                return

    def sent(self):
        """The driver is about to publish a batch's controls: a ``sent`` record now, ordered before their echoes
        (the job's clock bounds, ``Coordinator.published``)."""
        with self._cv:
            self._enqueue(self.sent_topic, b"")
            if len(self._pending) == 1:
                self._cv.notify()

    def _tick(self):
        """Queue a tick record (``_cv`` held, so it is ordered after every message before it); it is written
        like a message, outside the lock, so a slow log (Kafka down) never holds up the MQTT network thread."""
        self._enqueue(self.tick_topic, b"")
        self.stats["ticks"] += 1

    def _append(self, batch):
        """Append ``batch`` (retrying on I/O errors), then acknowledge it; False if stopped first."""
        records = [(a, t, p) for a, t, p, _, _, _ in batch if p is not None]
        delay = 0.05
        while True:
            try:
                self.spool.append(records)
                break
            except OSError as e:
                self.stats["spool_errors"] += 1
                log.error("bridge: append to the log failed (%s); retrying, nothing is acknowledged", e)
                if self._stopping:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        with self._cv:
            self.stats["batches"] += 1
            self.stats["spooled"] += sum(1 for r in records if r[1] != self.tick_topic)
            self.stats["oversized"] += len(batch) - len(records)
            for _, _, _, mid, qos, generation in batch:
                if qos and generation == self._generation:
                    self.client.ack(mid, qos)
                    self.stats["acked"] += 1
        return True
