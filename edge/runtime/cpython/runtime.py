"""paho-mqtt shell around the agent: ``quietfleet agent --config device.toml`` (DESIGN.md §3, §7).

One thread: ``client.loop()`` waits on the socket until the next reading or timer is due, so the
agent, its timers and its callbacks never run concurrently. MQTT 3.1.1, clean session, Last Will =
``agent.will()`` retained QoS 1 on ``state``; birth after every (re)connect; ``up`` and ``ctl`` QoS 1.
SIGINT/SIGTERM stop it cleanly: it publishes the offline state itself, disconnects and prints its
counters as one JSON line.
"""
import gc
import json
import logging
import os
import random
import signal
import socket
import sys
import time

import paho.mqtt.client as mqtt

from edge.agent import Agent
from edge.core import topics
from edge.runtime.cpython import config, inputs
from edge.runtime.outbox import Outbox
from edge.runtime.pump import Pump

log = logging.getLogger("quietfleet.agent")
MAX_WAIT = 0.5          # longest single socket wait, so signals and reconnects are handled promptly
BACKOFF = (0.2, 30.0)   # reconnect delay: first, cap (doubling, with jitter)


class Runtime:
    def __init__(self, cfg, clock=time.time):
        self.cfg = cfg
        self.clock = clock
        now = clock()
        names = list(cfg["sources"])
        # a random boot id: a restart within the same second must not look like a duplicate birth
        boot = cfg["boot"] if cfg["boot"] is not None else int.from_bytes(os.urandom(4), "little")
        self.agent = Agent(cfg["device"], names, boot=boot, width=cfg["width"])
        self.prefix = topics.device_prefix(cfg["fleet"], cfg["device"])
        self.truth = open(cfg["ground_truth"], "a", buffering=1) if cfg["ground_truth"] else None
        self.pump = Pump(self.agent, inputs.build(cfg, now), Outbox(cfg["outbox"], cfg["outbox_bytes"]), self._send, self.truth,
                         cfg["clock_skew"])
        self.connected = False
        self.stopping = False
        self.retry_at = now
        self.backoff = BACKOFF[0]
        self.client = self._client()

    def _client(self):
        b = self.cfg["broker"]
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=b["client_id"], protocol=mqtt.MQTTv311,
                        clean_session=True)
        c.username_pw_set(b["user"], self.cfg["password"])
        c.will_set(self.prefix + "state", self.agent.will(), qos=1, retain=True)
        if b["tls"]:
            c.tls_set(ca_certs=b["ca"], certfile=b["cert"], keyfile=b["key"])
        c.max_queued_messages_set(self.cfg["outbox"])
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.connect_async(b["host"], b["port"], keepalive=b["keepalive"])
        return c

    # -- transport --------------------------------------------------------------
    def _send(self, channel, payload):
        if not self.connected:
            return False
        info = self.client.publish(self.prefix + channel, payload, qos=1, retain=(channel == "state"))
        return info.rc == mqtt.MQTT_ERR_SUCCESS

    def _on_connect(self, client, userdata, flags, reason, properties):
        b = self.cfg["broker"]
        if reason.is_failure:
            log.error("the broker at %s:%s refused user %s: %s", b["host"], b["port"], b["user"], reason)
            return
        log.info("connected to %s:%s as %s", b["host"], b["port"], b["user"])
        self.connected = True
        self.backoff = BACKOFF[0]
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # no Nagle stalls
        client.subscribe(self.prefix + "ctl", qos=1)
        self.pump.online(self.clock())

    def _on_disconnect(self, client, userdata, flags, reason, properties):
        if self.connected:
            log.warning("disconnected: %s", reason)
        self.connected = False

    def _on_message(self, client, userdata, msg):
        self.pump.message(self.clock(), msg.payload)

    def _reconnect(self, now):
        self.retry_at = now + self.backoff * (0.5 + random.random())
        self.backoff = min(self.backoff * 2, BACKOFF[1])
        try:
            self.client.reconnect()
        except (OSError, ValueError) as e:      # ValueError: paho's for a bad host name
            b = self.cfg["broker"]
            log.warning("cannot reach the broker at %s:%s: %s", b["host"], b["port"], getattr(e, "strerror", None) or e)

    # -- main loop --------------------------------------------------------------
    def stop(self, *_):
        self.stopping = True

    def run(self):
        while not self.stopping:
            try:
                self._step()
            except MemoryError:         # the agent runs on (edge.runtime.pump: the loss shows as a gap)
                self.pump.oom()
                gc.collect()
                log.warning("out of memory: kept messages dropped (%d so far)", self.pump.ooms)
        self.close()

    def _step(self):
        now = self.clock()
        self.pump.poll(now)
        if not self.connected and now >= self.retry_at and self.client.socket() is None:
            self._reconnect(now)
        wake = self.pump.wake()
        wait = MAX_WAIT if wake is None else min(max(wake - self.clock(), 0.0), MAX_WAIT)
        if self.client.socket() is not None:
            if self.client.loop(timeout=wait) != mqtt.MQTT_ERR_SUCCESS:
                self.connected = False
        else:
            time.sleep(wait)

    def close(self):
        if self.connected:
            info = self.client.publish(self.prefix + "state", self.agent.will(), qos=1, retain=True)
            deadline = time.monotonic() + 2.0
            while not info.is_published() and time.monotonic() < deadline and self.client.socket() is not None:
                self.client.loop(timeout=0.1)
            self.client.disconnect()
        if self.truth is not None:
            self.truth.close()
        stats = dict(self.agent.stats, outbox=len(self.pump.outbox), outbox_dropped=self.pump.outbox.dropped,
                     oom=self.pump.ooms, **self.agent.delivery.stats)
        print(json.dumps({"stats": stats}), flush=True)


def run_agent(config_path):
    """``quietfleet agent --config device.toml``: run until SIGINT/SIGTERM; returns an exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        rt = Runtime(config.load(config_path))
    except (ValueError, OSError) as e:     # a bad or unreadable device.toml, a CSV, serial port or CA missing
        print("quietfleet agent: %s" % e, file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, rt.stop)
    signal.signal(signal.SIGTERM, rt.stop)
    rt.run()
    return 0


if __name__ == "__main__":
    sys.exit(run_agent(sys.argv[1]))
