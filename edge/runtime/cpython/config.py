"""Device configuration file ``device.toml`` for the CPython agent (DESIGN.md §7).

Example::

    fleet = "demo"
    device = "dev1"
    password = "secret"
    period = 1.0            # default sample period, seconds
    width = 1.0             # bound width until the backend assigns one
    outbox = 1024           # messages kept while disconnected
    outbox_bytes = 1048576  # ... and their payload bytes at most
    ground_truth = "truth.csv"   # optional: every sample as time,source,value
    clock_skew = 0.0        # optional (s): emulate a device clock this far ahead of the host's (tests)

    [broker]
    host = "127.0.0.1"
    port = 1883
    user = "dev1"           # broker user name (default: the device id, as quietfleet broker makes them)
    client_id = "qf-demo-dev1"   # MQTT client id (this default: qf-<fleet>-<device>)
    tls = false             # true: TLS, the broker's certificate checked against ca (default: the system's CAs)
    ca = "ca.crt"           # with tls: the CA that signed the broker's certificate
    cert = "dev1.crt"       # with tls, for a broker that asks for a client certificate ...
    key = "dev1.key"        # ... and its private key
    keepalive = 30

    [sources.temp]          # sources in file order; kind = walk | csv | serial | function
    kind = "walk"
    start = 20.0
    step = 0.1
    seed = 7
"""
import math
import os
import tomllib

DEFAULTS = {"period": 1.0, "width": 0.0, "outbox": 1024, "outbox_bytes": 1048576, "ground_truth": None, "boot": None, "clock_skew": 0.0}
BROKER_DEFAULTS = {"host": "127.0.0.1", "port": 1883, "tls": False, "ca": None, "cert": None, "key": None,
                   "keepalive": 30, "user": None, "client_id": None}
REQUIRED = ("fleet", "device", "password", "sources")
# what each key may hold: "str", "bool", "int" (with its least value), "num+" (> 0), "num0" (>= 0), "num"
TOP = {"fleet": "str", "device": "str", "password": "str", "sources": "table", "broker": "table",
       "period": "num+", "width": "num0", "outbox": ("int", 1), "outbox_bytes": ("int", 1),
       "ground_truth": "str", "boot": ("int", 0),
       "clock_skew": "num"}
BROKER = {"host": "str", "port": ("int", 1), "tls": "bool", "ca": "str", "cert": "str", "key": "str",
          "keepalive": ("int", 1), "user": "str", "client_id": "str"}
# per sensor kind: the keys a source of that kind takes (``required`` first)
KINDS = {"walk": ((), {"kind": "str", "start": "num", "step": "num0", "seed": ("int", 0), "period": "num+"}),
         "csv": (("path",), {"kind": "str", "path": "str", "speed": "num+"}),
         "serial": (("port",), {"kind": "str", "port": "str", "baud": ("int", 1)}),
         "function": (("call",), {"kind": "str", "call": "str", "period": "num+"})}


def _check(path, where, table, schema):
    """Refuse a key ``schema`` does not know (naming it and the known ones) and a value of the wrong type."""
    unknown = sorted(k for k in table if k not in schema)
    if unknown:
        raise ValueError("%s: unknown key%s %s (known%s: %s)" % (
            path, "s" if len(unknown) > 1 else "", ", ".join(where + k for k in unknown),
            " in [%s]" % where[:-1] if where else "", ", ".join(sorted(schema))))
    for key, value in table.items():
        want = schema[key]
        kind, least = want if isinstance(want, tuple) else (want, None)
        if kind == "str":
            ok, what = isinstance(value, str), "a string"
        elif kind == "bool":
            ok, what = isinstance(value, bool), "true or false"
        elif kind == "table":
            ok, what = isinstance(value, dict), "a table"
        elif kind == "int":
            ok, what = isinstance(value, int) and not isinstance(value, bool) and value >= least, \
                "an integer >= %d" % least
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
                (kind == "num" or value > 0 or (kind == "num0" and value == 0))
            what = {"num": "a number", "num+": "a number > 0", "num0": "a number >= 0"}[kind]
        if not ok:
            raise ValueError("%s: %s%s must be %s, got %r" % (path, where, key, what, value))


def load(path):
    """Read and check ``path`` (every problem a ``ValueError`` naming the key; an unreadable file an
    ``OSError``); relative file names inside it are resolved against its folder."""
    with open(path, "rb") as f:
        try:
            cfg = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError("%s is not valid TOML: %s" % (path, e))
    for key in REQUIRED:
        if key not in cfg:
            raise ValueError("%s: missing %r" % (path, key))
    if not isinstance(cfg["sources"], dict):
        raise ValueError("%s: sources must be tables [sources.NAME], got %r" % (path, cfg["sources"]))
    _check(path, "", cfg, TOP)
    if not cfg["sources"]:
        raise ValueError("%s: no sources" % path)
    for key, value in DEFAULTS.items():
        cfg.setdefault(key, value)
    _check(path, "broker.", cfg.get("broker", {}), BROKER)
    broker = dict(BROKER_DEFAULTS)
    broker.update(cfg.get("broker", {}))
    if broker["port"] > 65535:
        raise ValueError("%s: broker.port must be at most 65535, got %r" % (path, broker["port"]))
    cfg["broker"] = broker
    base = os.path.dirname(os.path.abspath(path))

    def resolve(p):
        return p if p is None or os.path.isabs(p) else os.path.join(base, p)

    cfg["ground_truth"] = resolve(cfg["ground_truth"])
    for key in ("ca", "cert", "key"):
        broker[key] = resolve(broker[key])
        if broker[key] is not None and not broker["tls"]:
            raise ValueError("%s: broker.%s needs broker.tls = true" % (path, key))
        if broker[key] is not None and not os.path.isfile(broker[key]):
            raise ValueError("%s: broker.%s %s does not exist" % (path, key, broker[key]))
    if broker["key"] is not None and broker["cert"] is None:
        raise ValueError("%s: broker.key needs broker.cert (the client certificate)" % path)
    broker["user"] = broker["user"] or cfg["device"]
    broker["client_id"] = broker["client_id"] or "qf-%s-%s" % (cfg["fleet"], cfg["device"])
    for name, spec in cfg["sources"].items():
        if not isinstance(spec, dict):
            raise ValueError("%s: source %r needs a table [sources.%s]" % (path, name, name))
        kind = spec.get("kind", "walk")
        if kind not in KINDS:
            raise ValueError("%s: source %s: unknown kind %r (kinds: %s)" % (path, name, kind, ", ".join(KINDS)))
        required, schema = KINDS[kind]
        _check(path, "sources.%s." % name, spec, schema)
        for key in required:
            if key not in spec:
                raise ValueError("%s: source %s (%s) needs %s" % (path, name, kind, key))
        if kind == "function" and (":" not in spec["call"] or not all(spec["call"].partition(":")[::2])):
            raise ValueError("%s: sources.%s.call must be \"module:function\", got %r" % (path, name, spec["call"]))
        if "path" in spec:
            spec["path"] = resolve(spec["path"])
            if not os.path.isfile(spec["path"]):
                raise ValueError("%s: source %s: CSV file %s does not exist" % (path, name, spec["path"]))
    return cfg
