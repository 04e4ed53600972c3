"""The live dashboard's server (DESIGN.md §10): one page fed from the broker, in a background thread.

``Dashboard`` subscribes as the backend user to the fleet's answers, specs, device states, uplinks
and downlinks (paho, its own network thread) and feeds ``backend.ui.state.DashboardState``; a Tornado
HTTP server in a thread of its own (its own asyncio loop) serves

* ``GET /``: the page (``static/index.html``, ``app.js``, uPlot vendored under ``static/vendor``);
* ``GET /api/state``: queries (latest answer and history), one page of devices, counts and totals
  (``offset``, ``limit``, ``q``, ``status`` page the devices as ``/api/devices`` does; ``history=0``
  leaves the histories out);
* ``GET /api/devices?offset=&limit=&q=&status=``: one page of devices in id order, searched on the server;
* ``GET /api/events``: server-sent events, one ``state`` event whenever something changed (at most
  every ``EVENT_EVERY`` s): queries with only their new history points, counts and totals (no device
  rows: the page fetches its page of devices when ``device_counts.version`` moved).

The same dashboard serves every driver; a driver passes a totals provider (``backend.ui.providers``)
for what only it knows. ``stop()`` closes the listening socket and every connection, ends both
threads and disconnects from the broker: the port is free again when it returns.
"""
import asyncio
import logging
import os
import threading
import time

import paho.mqtt.client as mqtt

from backend.live.access import configure
from backend.ui.state import HISTORY, PAGE, DashboardState
from edge.core import topics

log = logging.getLogger("quietfleet.ui")
PROVIDER_EVERY = 2.0        # s between calls of the driver's totals provider


def parse_ui(value):
    """``--ui [HOST:]PORT`` -> (host, port); the host defaults to 127.0.0.1 (the page is not protected)."""
    host, sep, port = str(value).rpartition(":")
    try:
        port = int(port)
    except ValueError:
        raise ValueError("--ui wants [HOST:]PORT, got %r" % (value,))
    if not 0 <= port <= 65535:
        raise ValueError("--ui port out of range: %d" % port)
    return (host or "127.0.0.1") if sep else "127.0.0.1", port


class Dashboard:
    """The dashboard of ``fleet`` on the broker at ``broker_host:broker_port`` (as ``user``), served on
    ``address:port`` (0: a free port; ``url`` tells which). ``provider``: the driver's totals
    (``backend.ui.providers``); ``specs``: query specs the driver was given outside the broker; ``tls``:
    None or ``{"ca", "cert", "key"}`` (``backend.live.access``)."""

    def __init__(self, fleet, broker_host, broker_port, password, port=0, address="127.0.0.1", user="backend",
                 provider=None, specs=(), history=HISTORY, tls=None, clock=time.time, client_id=None):
        self.fleet = fleet
        self.model = DashboardState(fleet, history, specs)
        self.lock = threading.Lock()
        self.provider = provider
        self.provided = {}
        self.provided_version = 0
        self.clock = clock
        self.address, self.port = address, port
        self.stopping = threading.Event()
        self._ready = threading.Event()
        self._thread = self._refresher = self._loop = self._server = None
        self._sockets = []
        self._error = None
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                        client_id=client_id or "qf-%s-ui-%d-%d" % (fleet, os.getpid(), id(self) & 0xFFFF),
                        protocol=mqtt.MQTTv311, clean_session=True)
        configure(c, user, password, tls)
        c.reconnect_delay_set(0.1, 2.0)
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        self.broker = (broker_host, broker_port)
        self.client = c

    # -- broker side ---------------------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason, properties):
        if reason.is_failure:
            log.error("broker refused the dashboard: %s", reason)
            return
        f = self.fleet
        client.subscribe([(topics.query(f, "+", "answer"), 0), (topics.query(f, "+", "final"), 0),
                          (topics.query(f, "+", "spec"), 0), (topics.backend(f), 0),
                          (topics.device(f, "+", "state"), 0), (topics.device(f, "+", "up"), 0),
                          (topics.device(f, "+", "ctl"), 0)])

    def _on_message(self, client, userdata, msg):
        self.feed(self.clock(), msg.topic, msg.payload, msg.retain)

    def feed(self, now, topic, payload, retained=False):
        """One broker message (the MQTT thread calls this; tests may too)."""
        try:
            with self.lock:
                self.model.message(now, topic, payload, retained)
        except Exception:       # a malformed message must not stop the dashboard
            log.exception("dashboard: message on %s", topic)

    # -- reads (HTTP thread) ---------------------------------------------------------------------------
    def state(self, since=None, devices=True, **page):
        with self.lock:
            return self.model.state(self.clock(), since=since, provided=self.provided, devices=devices, **page)

    def devices(self, **page):
        with self.lock:
            return self.model.devices_page(**page)

    def version(self):
        return (self.model.version, self.provided_version)

    # -- life cycle ------------------------------------------------------------------------------------
    @property
    def url(self):
        host = self.address if self.address not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return "http://%s:%d/" % ("[%s]" % host if ":" in host else host, self.port)

    def start(self, timeout=10.0):
        """Bind the port (an error here is the caller's), connect to the broker, start serving."""
        from tornado.netutil import bind_sockets
        self._sockets = bind_sockets(self.port, self.address or None)
        self.port = self._sockets[0].getsockname()[1]
        self.client.connect_async(*self.broker, keepalive=30)
        self.client.loop_start()
        self._thread = threading.Thread(target=self._serve, name="qf-ui-http", daemon=True)
        self._thread.start()
        if self.provider is not None:
            self._refresher = threading.Thread(target=self._refresh, name="qf-ui-provider", daemon=True)
            self._refresher.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.stop()
            raise RuntimeError("dashboard did not start: %s" % (self._error,))
        log.info("dashboard for fleet %s on %s", self.fleet, self.url)
        return self

    def _refresh(self):
        while not self.stopping.is_set():
            try:
                p = dict(self.provider() or {})
            except Exception as e:      # shown on the page; the driver goes on
                log.exception("dashboard totals provider failed")
                p = {"error": "%s: %s" % (type(e).__name__, e)}
            if p != self.provided:
                self.provided = p
                self.provided_version += 1
            self.stopping.wait(PROVIDER_EVERY)

    def _serve(self):
        try:
            asyncio.set_event_loop(asyncio.new_event_loop())
            from tornado.httpserver import HTTPServer
            from tornado.ioloop import IOLoop
            from backend.ui.web import application
            self._loop = IOLoop.current()
            self._server = HTTPServer(application(self), xheaders=False)
            self._server.add_sockets(self._sockets)
        except Exception as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.start()
        finally:
            self._loop.close(all_fds=True)
            asyncio.set_event_loop(None)

    async def _shutdown(self):
        from backend.ui.web import EVENT_EVERY
        self._server.stop()                         # closes the listening sockets
        await asyncio.sleep(0)
        try:
            await asyncio.wait_for(self._server.close_all_connections(), 2 * EVENT_EVERY + 1.0)
        except asyncio.TimeoutError:
            log.warning("dashboard: connections still open at stop")
        self._loop.stop()

    def stop(self, timeout=5.0):
        """Stop serving and disconnect; returns once the port is released (idempotent)."""
        self.stopping.set()
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.add_callback(self._shutdown)
            self._thread.join(timeout)
        elif self._thread is None:
            for s in self._sockets:
                s.close()
        self._thread = None
        if self._refresher is not None:
            self._refresher.join(timeout)
            self._refresher = None
        try:
            self.client.disconnect()
        except Exception:       # never connected
            pass
        self.client.loop_stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class UIError(RuntimeError, ValueError):
    """``--ui`` cannot be served (a bad value, a port in use); the drivers report it and stop."""


def start_for(ui, fleet, broker_host, broker_port, password, out=print, **kw):
    """Start a dashboard for a driver's ``--ui [HOST:]PORT`` (None: none); prints its address."""
    if ui is None:
        return None
    try:
        host, port = parse_ui(ui)
        d = Dashboard(fleet, broker_host, broker_port, password, port=port, address=host, **kw).start()
    except (OSError, ValueError, RuntimeError) as e:
        raise UIError("--ui %s: cannot serve the dashboard: %s" % (ui, e))
    out("dashboard: %s" % d.url)
    return d


__all__ = ["Dashboard", "UIError", "parse_ui", "start_for", "PAGE"]
