"""The micro:bit gateway's configuration (JSON, DESIGN.md §7), checked key by key before anything starts.

Example (``python -m edge.runtime.gateway.gateway gw.json``)::

    {"fleet": "demo", "gateway": "gw1", "password": "...",
     "host": "broker.example", "port": 8883, "keepalive": 10,
     "user": "gw1",                    # broker user (default: the gateway's name)
     "client_id": "gw1",               # sessions <client_id>.<sensor> (and <client_id> for the relay node)
     "tls": true, "ca": "ca.crt", "cert": "gw1.crt", "key": "gw1.key",
     "sensors": [{"name": "mb0", "port": "/dev/ttyACM0", "source": "s_mb0"}],
     "relay": {"h": 30, "m": 30, "shift": 10}, "truth": "truth/", "boot": 1, "run_for": 60}

An unknown key, a value of the wrong type, a missing file or an unknown relay parameter is a
``ValueError`` naming it; relative file names are resolved against the file's folder; ``null`` is the same
as leaving an optional key out (``quietfleet fleet`` writes ``"relay": null``).
"""
import inspect
import json
import math
import os

from edge.core.relay import RelayNode

REQUIRED = ("fleet", "gateway", "password", "port", "sensors")
KEYS = {"fleet": str, "gateway": str, "password": str, "host": str, "port": int, "keepalive": int, "user": str,
        "client_id": str, "tls": bool, "ca": str, "cert": str, "key": str, "sensors": list, "relay": dict,
        "truth": str, "boot": int, "run_for": float}
SENSOR = {"name": str, "port": str, "source": str}
RELAY = set(inspect.signature(RelayNode.__init__).parameters) - {"self", "device", "boot"} | {"shift"}


def _type_ok(value, kind):
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _keys(path, where, table, schema):
    unknown = sorted(k for k in table if k not in schema)
    if unknown:
        raise ValueError("%s: unknown key %s (known: %s)" % (path, ", ".join(where + k for k in unknown),
                                                             ", ".join(sorted(schema))))


def check(cfg, path="config"):
    """``cfg`` (a dict read from ``path``) checked, with defaults (``user``, ``client_id``, ``host``)."""
    if not isinstance(cfg, dict):
        raise ValueError("%s: expected a JSON object" % path)
    _keys(path, "", cfg, KEYS)
    cfg = {k: v for k, v in cfg.items() if v is not None or k in REQUIRED}     # null: not set (relay: none)
    for key in REQUIRED:
        if key not in cfg:
            raise ValueError("%s: missing %r" % (path, key))
    for key, value in cfg.items():
        if not _type_ok(value, KEYS[key]):
            raise ValueError("%s: %s must be %s, got %r" % (path, key, {str: "a string", int: "an integer",
                             bool: "true or false", list: "a list", dict: "an object", float: "a number > 0"}[KEYS[key]],
                             value))
    if not 0 < cfg["port"] < 65536:
        raise ValueError("%s: port must be 1..65535, got %d" % (path, cfg["port"]))
    if not cfg["sensors"]:
        raise ValueError("%s: no sensors" % path)
    for i, s in enumerate(cfg["sensors"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(s.get("port"), str):
            raise ValueError("%s: sensors[%d] needs a name and a serial port (strings)" % (path, i))
        _keys(path, "sensors[%d]." % i, s, SENSOR)
    _keys(path, "relay.", cfg.get("relay", {}), RELAY)
    base = os.path.dirname(os.path.abspath(path))
    for key in ("ca", "cert", "key"):
        if key in cfg:
            cfg[key] = os.path.join(base, cfg[key])
            if not cfg.get("tls"):
                raise ValueError("%s: %s needs \"tls\": true" % (path, key))
            if not os.path.isfile(cfg[key]):
                raise ValueError("%s: %s %s does not exist" % (path, key, cfg[key]))
    if "key" in cfg and "cert" not in cfg:
        raise ValueError("%s: key needs cert (the client certificate)" % path)
    cfg.setdefault("host", "127.0.0.1")
    cfg.setdefault("user", cfg["gateway"])
    cfg.setdefault("client_id", cfg["gateway"])
    return cfg


def load(path):
    """Read and check a gateway config file."""
    with open(path) as f:
        try:
            cfg = json.load(f)
        except ValueError as e:
            raise ValueError("%s is not JSON: %s" % (path, e))
    return check(cfg, path)
