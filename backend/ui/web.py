"""HTTP handlers of the dashboard (Tornado): thin, every answer comes from ``Dashboard`` (``server.py``)."""
import asyncio
import json
import os
import time

from tornado.iostream import StreamClosedError
from tornado.web import Application, HTTPError, RequestHandler, StaticFileHandler

from backend.ui.state import PAGE

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
EVENT_EVERY = 0.5           # s between live events at most (changes in between are merged)
KEEPALIVE = 15.0            # s between comments on an idle event stream (proxies keep it open)


class Base(RequestHandler):
    def initialize(self, dash):
        self.dash = dash

    def send(self, doc):
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc, allow_nan=False, separators=(",", ":")))

    def page_args(self):
        try:
            return {"offset": int(self.get_argument("offset", "0")), "limit": int(self.get_argument("limit", str(PAGE))),
                    "q": self.get_argument("q", ""), "status": self.get_argument("status", "")}
        except ValueError:
            raise HTTPError(400, "offset and limit must be integers")


class Index(Base):
    def get(self):
        self.set_header("Cache-Control", "no-store")
        with open(os.path.join(STATIC, "index.html"), "rb") as f:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(f.read())


class State(Base):
    def get(self):
        history = self.get_argument("history", "1") not in ("0", "false", "no")
        doc = self.dash.state(since={} if history else None, **self.page_args())
        self.send(doc)


class Devices(Base):
    def get(self):
        self.send(self.dash.devices(**self.page_args()))


class Events(Base):
    """Server-sent events: a ``state`` event on every change (at most every ``EVENT_EVERY`` s), each
    query's history only past what this stream already sent."""

    def initialize(self, dash):
        super().initialize(dash)
        self.closed = False

    def on_connection_close(self):
        self.closed = True

    async def get(self):
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")
        dash, since, last, quiet = self.dash, {}, None, time.monotonic()
        try:
            self.write("retry: 1000\n\n")
            await self.flush()
            while not self.closed and not dash.stopping.is_set():
                version = dash.version()
                if version != last:
                    last = version
                    doc = dash.state(since=since, devices=False)
                    for q in doc["queries"]:
                        since[q["id"]] = q["cursor"]
                    self.write("event: state\ndata: %s\n\n" % json.dumps(doc, allow_nan=False, separators=(",", ":")))
                    await self.flush()
                    quiet = time.monotonic()
                elif time.monotonic() - quiet > KEEPALIVE:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    quiet = time.monotonic()
                await asyncio.sleep(EVENT_EVERY)
        except StreamClosedError:
            return
        if not self.closed:
            self.finish()


def application(dash):
    kw = {"dash": dash}
    return Application([
        (r"/", Index, kw),
        (r"/api/state", State, kw),
        (r"/api/devices", Devices, kw),
        (r"/api/events", Events, kw),
        (r"/static/(.*)", StaticFileHandler, {"path": STATIC}),
    ])
