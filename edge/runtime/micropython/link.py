"""Reconnecting MQTT link on umqtt.simple for the MicroPython agent (DESIGN.md §3, §7).

umqtt.simple has no reconnect and delivers messages by callback, even from inside ``publish``
while it waits for a PUBACK; umqtt.robust retries forever with sleeps. This layer instead never
blocks the agent for long: failures mark the link down, ``up()`` reconnects with doubling backoff,
re-subscribes and reports the new session; a payload too large for the codec is drained in small
reads instead of allocated whole.

QoS 1 control messages are acknowledged only after the agent has handled them (``ack``), as
umqtt.simple and mqtt_as do by sending PUBACK after their callback returns; here the callback may run
inside a publish's PUBACK wait, where the agent must not be re-entered, so messages wait unacknowledged
in the inbox, and ``wait`` stops reading while the inbox is full. The broker keeps at most its
in-flight limit of them unacknowledged, so the inbox stays small; if a PUBACK wait still overflows
it (INBOX messages or INBOX_BYTES), the link is dropped without
acknowledging: with a clean session the broker forgets the rest, and the birth after reconnecting
resynchronises every source. No acknowledged message is ever lost.
"""
import select
import struct
import time

from edge.core import topics
from edge.core.codec import MAX_PAYLOAD
from umqtt.simple import MQTTClient

IO_TIMEOUT = 5          # seconds a started packet (or a PUBACK) may take: a half-open link fails, not hangs
INBOX = 20              # unacknowledged control messages held: Mosquitto's default max_inflight_messages
INBOX_BYTES = 6144      # ... and their bytes; more drops the link (counted), never an acknowledged message
BACKOFF_MS = (200, 30000)


class Client(MQTTClient):
    """umqtt.simple whose receive never allocates more than MAX_PAYLOAD: a larger PUBLISH payload
    is skipped and delivered as None, which the agent counts as a bad message. Reads after the first
    byte (and the PUBACK wait of a QoS 1 publish) time out after IO_TIMEOUT instead of blocking
    forever on a half-open connection. The callback gets the packet id (0 for QoS 0); the PUBACK is
    sent by ``ack`` once the message has been handled."""

    def wait_msg(self):
        sock = self.sock
        res = sock.read(1)
        sock.settimeout(IO_TIMEOUT)
        if res is None:
            return None
        if res == b"":
            raise OSError(-1)
        if res == b"\xd0":              # PINGRESP
            sock.read(1)
            return None
        op = res[0]
        if op & 0xF0 != 0x30:
            return op
        sz = self._recv_len()
        n = sock.read(2)
        topic = sock.read(n[0] << 8 | n[1])
        sz -= len(topic) + 2
        pid = 0
        if op & 6:
            pid = sock.read(2)
            pid = pid[0] << 8 | pid[1]
            sz -= 2
        if sz > MAX_PAYLOAD:
            msg = None
            skip = bytearray(64)
            while sz > 0:
                n = sock.readinto(skip, min(sz, 64))
                if not n:
                    raise OSError(-1)
                sz -= n
        else:
            msg = sock.read(sz)
        if op & 6 == 4:
            raise OSError(-2)           # QoS 2 is never subscribed to
        self.cb(topic, msg, pid)

    def ack(self, pid):
        pkt = bytearray(b"\x40\x02\0\0")
        struct.pack_into("!H", pkt, 2, pid)
        self.sock.write(pkt)


class Link:
    def __init__(self, cfg, will):
        self.prefix = topics.device_prefix(cfg["fleet"], cfg["device"])
        self.keepalive = cfg.get("keepalive", 30)
        # user and client id: an operator's own broker may name them (default: the device id, qf-<fleet>-<device>)
        c = Client(cfg.get("client_id") or "qf-%s-%s" % (cfg["fleet"], cfg["device"]), cfg.get("host", "127.0.0.1"),
                   cfg.get("port", 1883), cfg.get("user") or cfg["device"], cfg["password"], self.keepalive)
        c.set_last_will(self.prefix + "state", will, True, 1)
        c.set_callback(self._inbound)
        self.client = c
        self.inbox = []         # (packet id, payload) not acknowledged yet, oldest first
        self.held = 0           # their bytes
        self.overflows = 0
        self.connected = False
        self.poller = None
        self.backoff = BACKOFF_MS[0]
        self.retry_at = time.ticks_ms()
        self.last_tx = self.last_rx = self.retry_at
        self.failures = 0      # lost links and failed connects

    def _inbound(self, topic, msg, pid):
        n = len(msg) if msg else 0
        if len(self.inbox) >= INBOX or self.held + n > INBOX_BYTES:
            self.overflows += 1
            raise OSError("inbox full")     # unacknowledged: the broker keeps nothing of it (clean session)
        self.inbox.append((pid, msg))
        self.held += n

    def take(self):
        """The oldest waiting ``(packet id, payload)``; ``ack`` its id once it has been handled."""
        pid, msg = self.inbox.pop(0)
        self.held -= len(msg) if msg else 0
        return pid, msg

    def ack(self, pid):
        """Acknowledge a handled message (QoS 1: its packet id); a failed write drops the link."""
        if not pid or not self.connected:
            return
        try:
            self.client.ack(pid)
            self.last_tx = time.ticks_ms()
        except Exception as e:
            print("qf: ack failed: %r" % (e,))
            self.down()

    def down(self):
        self.failures += 1
        self.connected = False
        self.inbox = []         # never acknowledged; the birth after reconnecting resynchronises
        self.held = 0
        try:
            self.client.sock.close()
        except Exception:
            pass
        self.retry_at = time.ticks_add(time.ticks_ms(), self.backoff)
        self.backoff = min(self.backoff * 2, BACKOFF_MS[1])

    def up(self):
        """Try to (re)connect when the backoff allows; True on a new session."""
        if self.connected or time.ticks_diff(self.retry_at, time.ticks_ms()) > 0:
            return False
        try:
            self.client.connect(timeout=IO_TIMEOUT)     # a CONNECT lost in a cut fails, not hangs
            try:
                # umqtt writes each packet in several pieces; with Nagle on, the broker's delayed
                # ACK stalls every QoS 1 publish by ~40 ms. (IPPROTO_TCP, TCP_NODELAY)
                self.client.sock.setsockopt(6, 1, 1)
            except OSError:
                pass                    # a board's stack without the option
            self.client.sock.settimeout(IO_TIMEOUT)
            self.client.subscribe(self.prefix + "ctl", 1)
        except Exception as e:   # OSError, or MQTTException when the broker refuses us
            print("qf: connect failed: %r" % (e,))
            self.down()
            return False
        self.poller = select.poll()
        self.poller.register(self.client.sock, select.POLLIN)
        self.connected = True
        self.backoff = BACKOFF_MS[0]
        self.last_tx = self.last_rx = time.ticks_ms()
        return True

    def send(self, channel, payload):
        """Publish QoS 1 (retained on ``state``) and wait for its PUBACK; False if the link failed."""
        if not self.connected:
            return False
        try:
            self.client.publish(self.prefix + channel, payload, channel == "state", 1)
        except Exception as e:
            print("qf: publish failed: %r" % (e,))
            self.down()
            return False
        self.last_tx = self.last_rx = time.ticks_ms()     # its PUBACK came from the broker
        return True

    def wait(self, ms):
        """Wait up to ``ms`` for traffic and process it; keep the session alive with pings."""
        if not self.connected:
            time.sleep_ms(ms)
            return
        now = time.ticks_ms()
        try:
            if time.ticks_diff(now, self.last_tx) >= self.keepalive * 500:
                self.client.ping()
                self.last_tx = now
            if time.ticks_diff(now, self.last_rx) > self.keepalive * 1500:
                raise OSError("no traffic from the broker for 1.5 keepalives")
            ready = self.poller.poll(ms) if len(self.inbox) < INBOX else ()
            while ready and len(self.inbox) < INBOX:    # full: the rest waits in TCP (backpressure)
                if ready[0][1] & (select.POLLHUP | select.POLLERR):
                    raise OSError("socket closed")
                self.last_rx = time.ticks_ms()
                self.client.check_msg()      # one packet: a PUBLISH goes to the inbox, PINGRESP is eaten
                ready = self.poller.poll(0)
        except Exception as e:
            print("qf: link lost: %r" % (e,))
            self.down()

    def close(self, payload):
        """Clean stop: publish the offline state ourselves (no Will on a clean disconnect)."""
        if self.connected and self.send("state", payload):
            try:
                self.client.disconnect()
            except Exception:
                pass
        self.connected = False
