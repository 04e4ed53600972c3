"""Board configuration files (``qf.json`` on the board; templates in firmware/boards/, DESIGN.md §7).

``load(path)`` checks a device JSON and says exactly what is wrong; ``template(board)`` is the
starting point for a board kind. The agent on the board reads the same keys (edge/runtime/micropython/
qfagent.py, firmware/qfboard.py).
"""
import json
import os

BOARDS = {"esp32": "esp32.json", "rp2": "pico_w.json", "pico_w": "pico_w.json"}
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_KINDS = ("adc", "walk", "csv")
# what the board agent reads (edge/runtime/micropython/qfagent.py, link.py, firmware/qfboard.py)
KEYS = ("board", "wifi", "fleet", "device", "password", "host", "port", "user", "client_id", "keepalive", "period",
        "width", "outbox", "outbox_bytes", "sources", "ground_truth", "boot", "run_for")


class ConfigError(ValueError):
    """A device config that a board could not run."""


def template(board):
    if board not in BOARDS:
        raise ConfigError("unknown board %r; choose one of %s" % (board, ", ".join(sorted(BOARDS))))
    with open(os.path.join(HERE, "boards", BOARDS[board])) as f:
        return json.load(f)


def check(cfg, where="config"):
    if not isinstance(cfg, dict):
        raise ConfigError("%s: expected a JSON object" % where)
    unknown = sorted(k for k in cfg if k not in KEYS)
    if unknown:
        raise ConfigError("%s: unknown key %s (known: %s)" % (where, ", ".join(unknown), ", ".join(KEYS)))
    for key, kind in (("fleet", str), ("device", str), ("password", str), ("host", str), ("sources", list)):
        if not isinstance(cfg.get(key), kind):
            raise ConfigError("%s: %r must be a %s" % (where, key, kind.__name__))
    for key in ("user", "client_id"):
        if key in cfg and not (isinstance(cfg[key], str) and cfg[key]):
            raise ConfigError("%s: %r must be a non-empty string" % (where, key))
    port = cfg.get("port", 1883)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError("%s: port must be an integer 1..65535" % where)
    w = cfg.get("wifi")
    if w is not None and not (isinstance(w, dict) and isinstance(w.get("ssid"), str)):
        raise ConfigError("%s: wifi must be {\"ssid\": ..., \"password\": ...}" % where)
    if not cfg["sources"]:
        raise ConfigError("%s: no sources" % where)
    for i, s in enumerate(cfg["sources"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            raise ConfigError("%s: sources[%d] needs a name" % (where, i))
        if s.get("kind", "walk") not in SOURCE_KINDS:
            raise ConfigError("%s: sources[%d].kind must be one of %s" % (where, i, ", ".join(SOURCE_KINDS)))
        if s.get("kind") == "adc" and not isinstance(s.get("pin"), int):
            raise ConfigError("%s: sources[%d] (adc) needs an integer pin" % (where, i))
    return cfg


def load(path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise ConfigError("cannot read %s: %s" % (path, e.strerror))
    except ValueError as e:
        raise ConfigError("%s is not valid JSON: %s" % (path, e))
    return check(cfg, path)


def write(cfg, path):
    with open(path, "w") as f:
        json.dump(cfg, f, separators=(",", ":"))
