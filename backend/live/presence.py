"""The backend's own state topic (DESIGN.md §3 birth and Last Will, applied to the backend): answers say whether anyone stands behind them.

Answers are retained: a consumer subscribing to ``qf/<fleet>/q/<id>/answer`` gets the latest one whether
the backend that made it is running or not, and a backend that died leaves its last answers looking
current (``degraded: false``). So the backend keeps ``qf/<fleet>/backend/state`` (retained, QoS 1), like a
device's ``state``:

* on every (re)connect it publishes ``online``: ``{"state": "online", "driver", "protocol", "kinds" (the
  query kinds it runs), "since", "client"}``;
* its MQTT Last Will, which the broker publishes when the backend's connection dies (a crash, a kill, a
  cut network), is ``{"state": "offline", "driver", "reason": "connection lost", "client"}``;
* on a clean stop it publishes ``{"state": "offline", "reason": "stopped", "since"}`` itself (a clean
  disconnect sends no Will).

The convention (README, "Watching answers"): an answer holds only while the backend's state is
``online``; while it is ``offline`` every retained answer of the fleet is stale, whatever it says. The
dashboard and ``quietfleet query list`` show them so (``stale``).
"""
import json

from edge.core import topics

QOS = 1


def online(driver, protocol, kinds, since, client=None):
    """The ``online`` payload (bytes) of a backend run started at ``since`` (wall-clock seconds)."""
    return _json({"state": "online", "driver": driver, "protocol": protocol, "kinds": sorted(kinds),
                  "since": since, "client": client})


def offline(driver, reason, since=None, client=None):
    """An ``offline`` payload: ``reason`` ``connection lost`` (the Will) or ``stopped`` (a clean stop)."""
    return _json({"state": "offline", "driver": driver, "reason": reason, "since": since, "client": client})


def _json(d):
    return json.dumps({k: v for k, v in d.items() if v is not None}, sort_keys=True).encode()


def will(client, fleet, driver, client_id=None):
    """Register the backend's Last Will on a paho ``client`` (before it connects)."""
    client.will_set(topics.backend(fleet), offline(driver, "connection lost", client=client_id), qos=QOS, retain=True)


def parse(payload):
    """A backend state (dict with ``state`` ``online``/``offline``) from a payload; None if empty or not one."""
    try:
        d = json.loads(bytes(payload or b"") or b"null")
    except ValueError:
        return None
    return d if isinstance(d, dict) and d.get("state") in ("online", "offline") else None


def stale(state):
    """Why retained answers are stale under backend ``state`` (a ``parse`` result or None), or None if they
    are current. No state at all is not stale: a backend older than this convention publishes none."""
    if state is None or state.get("state") != "offline":
        return None
    return "backend offline (%s)" % state.get("reason", "unknown")
