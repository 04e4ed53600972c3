"""MicroPython link (edge/runtime/micropython/link.py): a QoS 1 control message is acknowledged only
after the agent has handled it; an overflowing inbox drops the link, never an acknowledged message.
MicroPython only (umqtt); under CPython the module defines no tests."""
import sys

from portable import MICROPYTHON


class Sock:
    """The broker's side of a socket: bytes to read, bytes written."""

    def __init__(self, data=b""):
        self.data = bytearray(data)
        self.out = bytearray()

    def read(self, n):
        chunk = bytes(self.data[:n])
        self.data = self.data[n:]
        return chunk

    def readinto(self, buf, n):
        chunk = self.read(n)
        buf[:len(chunk)] = chunk
        return len(chunk)

    def write(self, b, n=None):
        if isinstance(b, str):
            b = b.encode()
        self.out += bytes(b if n is None else b[:n])
        return len(b)

    def settimeout(self, t):
        pass

    def setblocking(self, flag):
        pass

    def close(self):
        pass


def publish(pid, payload, topic=b"qf/f/d/d1/ctl"):
    body = bytes((len(topic) >> 8, len(topic) & 255)) + topic + bytes((pid >> 8, pid & 255)) + payload
    return bytes((0x32, len(body))) + body


def _link(data):
    from link import Link
    link = Link({"fleet": "f", "device": "d1", "password": "p"}, b"gone")
    link.client.sock = Sock(data)
    link.connected = True
    return link


if MICROPYTHON:
    sys.path.append("edge/runtime/micropython")

    def test_acknowledged_only_after_handling():
        link = _link(publish(7, b"a") + publish(8, b"bb"))
        link.client.wait_msg()
        link.client.wait_msg()
        assert [m for _, m in link.inbox] == [b"a", b"bb"] and link.client.sock.out == b""
        pid, msg = link.take()
        assert (pid, msg) == (7, b"a") and link.held == 2 and link.client.sock.out == b""
        link.ack(pid)                   # the agent has handled it
        assert link.client.sock.out == b"\x40\x02\x00\x07"

    def test_messages_arriving_during_a_puback_wait_wait_unacknowledged():
        link = _link(publish(9, b"ctl") + b"\x40\x02\x00\x01")     # a control, then our PUBACK
        assert link.send("up", b"report")
        assert link.inbox == [(9, b"ctl")] and b"\x40\x02\x00\x09" not in link.client.sock.out

    def test_a_device_that_only_publishes_keeps_its_link():
        # PUBACKs are traffic from the broker: a device reporting more often than it would ping, with no
        # control coming, once dropped its link every 1.5 keepalives (a Last Will and a birth each time)
        import time

        class Idle:
            def poll(self, ms):
                return ()

        link = _link(b"\x40\x02\x00\x01")      # our PUBACK
        link.poller = Idle()
        link.last_rx = time.ticks_add(time.ticks_ms(), -link.keepalive * 1600)   # the last control, long ago
        assert link.send("up", b"report")
        link.wait(0)
        assert link.connected and link.failures == 0

    def test_overflow_drops_the_link_without_acknowledging():
        from link import INBOX
        link = _link(b"".join(publish(i + 1, b"m") for i in range(INBOX + 1)))
        try:
            for _ in range(INBOX + 1):
                link.client.wait_msg()
        except OSError:
            pass
        else:
            raise AssertionError("no overflow")
        sock = link.client.sock
        link.down()
        assert sock.out == b"" and link.overflows == 1 and link.inbox == [] and not link.connected
