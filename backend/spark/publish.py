"""The Spark job's MQTT publisher (DESIGN.md §3, §6): downlinks at QoS 1 through a bounded in-flight
window, retained answers at QoS 0 re-published on every reconnect, one wait per batch.

``publish`` hands a message to paho and returns; it waits only while ``window`` QoS 1 messages are
unacknowledged (the broker's pace bounds memory and keeps 16-bit message ids unique). ``flush``
waits, once per batch, until every QoS 1 message of the batch is acknowledged: the sink marks a
batch delivered only then, so a crash before it replays the batch (the same bytes: agents drop the
repeats) and nothing is lost. While the broker is away, QoS 1 messages stay queued in paho and are
sent again on reconnect (``dup``); ``flush`` keeps waiting (the stream stalls, the spool grows)
until they are acknowledged or the publisher is closed. Retained answers are QoS 0 (DESIGN.md §3),
which paho drops while disconnected, so the latest payload of every retained topic is kept and
published again on each (re)connect, in order with new answers (one lock). ``state`` (topic, online,
Will payloads) is the backend's own state (``backend.live.presence``): its Will registered before the
first connect, the online payload published on every connect before the answers, and ``close(farewell)``
publishes the offline one itself.
"""
import threading
import time

import paho.mqtt.client as mqtt

from backend.live.access import configure

WINDOW = 1000       # QoS 1 messages in flight (unacknowledged) at most


def acked(info):
    """Whether the broker acknowledged a QoS 1 message. paho's ``is_published`` raises for a message
    handed over while disconnected (its ``rc`` stays NO_CONN) even once the resend was acknowledged,
    so the flag paho sets on PUBACK is read directly (paho-mqtt 2.1, pinned)."""
    return info._published


class PublisherClosed(RuntimeError):
    """``flush`` was waiting for acknowledgements when the publisher was closed."""


class Publisher:
    def __init__(self, host, port, username, password, client_id, window=WINDOW, tls=None, state=None):
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                                  clean_session=True)
        configure(self.client, username, password, tls)      # tls: backend.live.access
        self.state = state
        if state is not None:
            self.client.will_set(state[0], state[2], qos=1, retain=True)
        self.client.max_inflight_messages_set(window)
        self.client.max_queued_messages_set(0)
        self.client.reconnect_delay_set(0.2, 5)
        self.client.on_connect = self._on_connect
        self.window = window
        self.retained = {}       # topic -> latest retained payload (b"" clears the topic)
        self.pending = []        # QoS 1 MQTTMessageInfo handed over since the last flush
        self.done = 0            # pending[:done] are acknowledged
        self.closed = False
        self.connects = 0
        self.stats = {"published": 0, "republished": 0, "window_waits": 0}
        self._order = threading.Lock()
        self.client.connect_async(host, port, keepalive=30)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            return
        with self._order:           # answers handed over before the first connect were dropped too
            self.connects += 1
            if self.state is not None:
                client.publish(self.state[0], self.state[1], qos=1, retain=True)
            for topic, payload in self.retained.items():
                client.publish(topic, payload, qos=0, retain=True)
            self.stats["republished"] += len(self.retained)

    def publish(self, topic, payload, qos, retain=False):
        if qos:
            self._wait(self.window - 1)
        with self._order:
            if retain:
                self.retained[topic] = payload
            info = self.client.publish(topic, payload, qos=qos, retain=retain)
        self.stats["published"] += 1
        if qos:
            self.pending.append(info)

    def _wait(self, most, timeout=None):
        """Wait until at most ``most`` QoS 1 messages are unacknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending, waited = self.pending, False
        while True:
            while self.done < len(pending) and acked(pending[self.done]):
                self.done += 1
            left = len(pending) - self.done
            if left > most:         # acks may come out of order: count the rest
                left = sum(1 for i in pending[self.done:] if not acked(i))
            if left <= most:
                return
            if self.closed:
                raise PublisherClosed("publisher closed with %d messages unacknowledged" % left)
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError("MQTT broker did not acknowledge %d of the job's messages within %.0fs"
                                   % (left, timeout))
            if most and not waited:
                waited = True
                self.stats["window_waits"] += 1
            time.sleep(0.002)

    def flush(self, timeout=None):
        """Wait until every QoS 1 message handed over since the last flush is acknowledged."""
        self._wait(0, timeout)
        self.pending, self.done = [], 0

    def close(self, farewell=None):
        """Disconnect; ``farewell``: the offline state to publish first (a clean disconnect sends no Will)."""
        self.closed = True
        if farewell is not None and self.state is not None and self.client.is_connected():
            try:
                self.client.publish(self.state[0], farewell, qos=1, retain=True).wait_for_publish(2)
            except (RuntimeError, ValueError):      # the link went meanwhile: the Will says it
                pass
        self.client.disconnect()
        self.client.loop_stop()
