"""Device configuration file ``device.toml`` for the CPython agent (DESIGN.md §7).

Example::

    fleet = "demo"
    device = "dev1"
    password = "secret"
    period = 1.0            # default sample period, seconds
    width = 1.0             # bound width until the backend assigns one
    outbox = 1024           # messages kept while disconnected
    ground_truth = "truth.csv"   # optional: every sample as time,source,value

    [broker]
    host = "127.0.0.1"
    port = 1883
    tls = false             # true: also set ca = "ca.crt"
    keepalive = 30

    [sources.temp]          # sources in file order; kind = walk | csv | serial | function
    kind = "walk"
    start = 20.0
    step = 0.1
    seed = 7
"""
import os
import tomllib

DEFAULTS = {"period": 1.0, "width": 0.0, "outbox": 1024, "ground_truth": None, "boot": None}
BROKER_DEFAULTS = {"host": "127.0.0.1", "port": 1883, "tls": False, "ca": None, "keepalive": 30}


def load(path):
    """Read and check ``path``; relative file names inside it are resolved against its folder."""
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    for key in ("fleet", "device", "password", "sources"):
        if key not in cfg:
            raise ValueError("%s: missing %r" % (path, key))
    if not cfg["sources"]:
        raise ValueError("%s: no sources" % path)
    for key, value in DEFAULTS.items():
        cfg.setdefault(key, value)
    broker = dict(BROKER_DEFAULTS)
    broker.update(cfg.get("broker", {}))
    cfg["broker"] = broker
    base = os.path.dirname(os.path.abspath(path))

    def resolve(p):
        return p if p is None or os.path.isabs(p) else os.path.join(base, p)

    cfg["ground_truth"] = resolve(cfg["ground_truth"])
    broker["ca"] = resolve(broker["ca"])
    for name, spec in cfg["sources"].items():
        if not isinstance(spec, dict):
            raise ValueError("%s: source %r needs a table" % (path, name))
        if "path" in spec:
            spec["path"] = resolve(spec["path"])
    return cfg
