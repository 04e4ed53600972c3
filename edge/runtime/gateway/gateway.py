"""The micro:bit gateway (DESIGN.md §7; Zhang et al. 2005 §3.1 relay node): serial sensors to MQTT, CPython.

A Raspberry Pi class process (also under QEMU ARM64) that owns one serial line per micro:bit
(pyserial; a QEMU board's ``-serial pty`` is opened like ``/dev/ttyACM0``) and, per sensor, one MQTT
session under the gateway's credentials with the sensor's own topics, client id and Last Will (the
broker's ACL grants the gateway exactly its sensors' topics, ``backend/live/broker.py``). ``Bridge``
translates. With ``relay`` set, every sample the sensors log also enters an
``edge.core.relay.RelayNode`` (hCount sketch, forecast and correct bodies) that publishes as the
gateway's own device, so relay queries run on the live coordinator. ``truth`` names a folder for
each sensor's ground truth (``time,source,value`` in value units, from the device's sample frames,
each logged once the frame after it is read: ``_log``).

``python -m edge.runtime.gateway.gateway CONFIG.json`` (keys: ``edge.runtime.gateway.config``; broker user,
TLS files and client ids for an operator's own broker too); SIGINT/SIGTERM stop it cleanly (each sensor
publishes its offline state); it prints ``{"stats": ...}`` on exit.
"""
import json
import os
import queue
import select
import signal
import sys
import time

import paho.mqtt.client as mqtt
import serial

from edge.core import codec, topics
from edge.core.relay import RelayNode
from edge.runtime.gateway import config
from edge.runtime.gateway.bridge import SCALE, Bridge

SILENT = 6.0            # s without a frame before a sensor counts as offline


class Sensor:
    def __init__(self, gw, spec, boot):
        self.name = spec["name"]
        self.bridge = Bridge(spec.get("source", "s_" + self.name), boot)
        self.port = serial.Serial(spec["port"], 115200, timeout=0)
        self.port.reset_input_buffer()
        self.synced = False             # the first line read may start mid-frame: dropped
        self.buf = b""
        self.online = True
        self.truth = None
        self.held = None                # the latest sample, logged once the board's next frame is read
        if gw.truth:
            self.truth = open(os.path.join(gw.truth, "truth-%s.csv" % self.name), "a", buffering=1)
        self.prefix = topics.device_prefix(gw.fleet, self.name)
        self.client = gw.session("%s.%s" % (gw.cfg["client_id"], self.name), self.prefix + "state", self.bridge.boot)
        self.client.on_connect = lambda c, u, f, rc, p: rc.is_failure or (
            c.subscribe(self.prefix + "ctl", qos=1), gw.inbox.put((self, None)))   # (re)connected: a fresh birth
        self.client.on_message = lambda c, u, m: gw.inbox.put((self, m.payload))


class Gateway:
    def __init__(self, cfg):
        cfg = config.check(dict(cfg))
        self.fleet = cfg["fleet"]
        self.name = cfg["gateway"]
        self.cfg = cfg
        self.truth = cfg.get("truth")
        if self.truth:
            os.makedirs(self.truth, exist_ok=True)
        self.inbox = queue.Queue()
        self.stopping = False
        boot = int(cfg.get("boot", time.time()))
        self.sensors = [Sensor(self, s, boot + i) for i, s in enumerate(cfg["sensors"])]
        self.relay = None
        rel = cfg.get("relay")
        if rel is not None:
            rel = dict(rel)
            self.shift = rel.pop("shift", 10)
            self.relay = RelayNode(self.name, boot=boot & 0xFFFFFFFF, **rel)
            self.prefix = topics.device_prefix(self.fleet, self.name)
            self.own = self.session(cfg["client_id"], self.prefix + "state", boot)
            self.own.on_connect = lambda c, u, f, rc, p: rc.is_failure or c.subscribe(self.prefix + "ctl", qos=1)
            self.own.on_message = lambda c, u, m: self.inbox.put((None, m.payload))
        self.stats = {"noise": 0, "lines": []}

    def session(self, client_id, will_topic, boot):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                        clean_session=False)
        c.username_pw_set(self.cfg["user"], self.cfg["password"])
        if self.cfg.get("tls"):
            c.tls_set(ca_certs=self.cfg.get("ca"), certfile=self.cfg.get("cert"), keyfile=self.cfg.get("key"))
        c.will_set(will_topic, codec.encode("gone", {"boot": boot & 0xFFFFFFFF}), qos=1, retain=True)
        c.reconnect_delay_set(0.1, 2.0)
        return c

    def connect(self):
        clients = [s.client for s in self.sensors] + ([self.own] if self.relay else [])
        for c in clients:
            c.connect_async(self.cfg["host"], self.cfg["port"], keepalive=self.cfg.get("keepalive", 10))
            c.loop_start()
        deadline = time.monotonic() + 10
        while not all(c.is_connected() for c in clients) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not all(c.is_connected() for c in clients):      # paho goes on trying: say where and as whom
            print("gateway: not connected to the broker at %s:%s as %s within 10 s (a wrong password, ACL or "
                  "certificate?); still trying" % (self.cfg["host"], self.cfg["port"], self.cfg["user"]),
                  file=sys.stderr, flush=True)

    # -- actions -------------------------------------------------------------------------
    def act(self, sensor, now, actions):
        for a in actions:
            if a[0] == "tx":
                sensor.port.write(a[1])
            elif a[0] in ("up", "state"):
                sensor.client.publish(sensor.prefix + a[0], a[1], qos=1, retain=a[0] == "state")
                sensor.online = True
            elif a[0] == "sample":
                sensor.held = a
                if self.relay is not None:
                    self.relay_out(self.relay.handle_item(now, self._item(a[2]), a[1]))
            elif a[0] == "noise":
                self.stats["noise"] += 1
                if len(self.stats["lines"]) < 20:
                    self.stats["lines"].append(a[1].decode(errors="replace").strip())

    def read(self, s, now):
        """What sensor ``s``'s serial line holds: each whole frame through its bridge."""
        s.buf += s.port.read(4096)
        if not s.synced and b"\n" in s.buf:
            s.buf = s.buf.split(b"\n", 1)[1]
            s.synced = True
        while s.synced and b"\n" in s.buf:
            line, s.buf = s.buf.split(b"\n", 1)
            held, s.held = s.held, None
            self.act(s, now, s.bridge.from_device(now, line))
            self._log(s, held)
        if len(s.buf) > 512:
            s.buf = b""

    @staticmethod
    def _log(sensor, a):
        """Write sample action ``a`` (held since its frame) to the ground truth. A board sends a sample's
        report right after the sample, so once the next frame has been handled that report (if any) has
        gone out; the sample held when the gateway stops is never logged, as its report may still be on
        the wire."""
        if a is not None and sensor.truth is not None:
            sensor.truth.write("%r,%s,%r\n" % (a[1], sensor.bridge.source, a[2] / SCALE))

    def _item(self, v):
        return min(max(v >> self.shift, self.relay.lo), self.relay.hi)

    def relay_out(self, actions):
        for channel, payload in actions:
            self.own.publish(self.prefix + channel, payload, qos=1, retain=channel == "state")

    # -- loop ----------------------------------------------------------------------------
    def run(self, duration=None):
        self.connect()
        now = time.time()
        if self.relay is not None:
            self.relay_out(self.relay.start(now))
        end = None if duration is None else time.monotonic() + duration
        fds = {s.port.fileno(): s for s in self.sensors}
        while not self.stopping and (end is None or time.monotonic() < end):
            wait = 0.05
            if self.relay is not None and self.relay.next_deadline() is not None:
                wait = max(0.0, min(wait, self.relay.next_deadline() - time.time()))
            ready, _, _ = select.select(list(fds), [], [], wait)
            now = time.time()
            for fd in ready:
                self.read(fds[fd], now)
            while True:
                try:
                    s, payload = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if s is None:
                    self.relay_out(self.relay.handle_message(now, payload))
                elif payload is None:
                    self.act(s, now, s.bridge.rebirth(now))
                else:
                    self.act(s, now, s.bridge.from_backend(now, payload))
            for s in self.sensors:
                self.act(s, now, s.bridge.poll(now))
                last = s.bridge.last_rx
                if s.online and last is not None and now - last > SILENT:
                    s.online = False
                    s.client.publish(s.prefix + "state", codec.encode("gone", {"boot": s.bridge.boot}), qos=1,
                                     retain=True)
            if self.relay is not None:
                self.relay_out(self.relay.handle_timer(now))
        return self.close()

    def close(self):
        out = {}
        for s in self.sensors:
            info = s.client.publish(s.prefix + "state", codec.encode("gone", {"boot": s.bridge.boot}), qos=1,
                                    retain=True)
            try:
                info.wait_for_publish(2)
            except (RuntimeError, ValueError):
                pass
            s.client.disconnect()
            s.client.loop_stop()
            s.port.close()
            if s.truth is not None:
                s.truth.close()
            out[s.name] = dict(s.bridge.stats, unlogged=int(s.held is not None and s.truth is not None))   # see _log
        if self.relay is not None:
            self.own.publish(self.prefix + "state", codec.encode("gone", {"boot": self.relay.boot}), qos=1,
                             retain=True).wait_for_publish(2)
            self.own.disconnect()
            self.own.loop_stop()
            out[self.name] = dict(self.relay.stats)
        out["gateway"] = self.stats
        return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m edge.runtime.gateway.gateway CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = config.load(argv[0])
        gw = Gateway(cfg)
    except (OSError, ValueError, serial.SerialException) as e:     # a bad config, a serial port missing
        print("gateway: %s" % e, file=sys.stderr)
        return 2

    def stop(*_):
        gw.stopping = True
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    stats = gw.run(cfg.get("run_for"))
    print(json.dumps({"stats": stats}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
