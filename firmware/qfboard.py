"""Board glue for the MicroPython agent (DESIGN.md §7): Wi-Fi with backoff, watchdog, clock, ADC inputs.

``run(path)`` is what ``main.py`` calls: it reads the board config (``qf.json``), joins Wi-Fi
(doubling backoff, never giving up), sets the clock by NTP when it can (when it cannot, the agent
takes the backend's time, so a failed NTP no longer makes every report late),
arms ``machine.WDT`` when the port has one and feeds it from the agent loop, builds ``adc`` inputs
from pins, then runs ``qfagent.main``. On the unix port (an emulated board) there is no ``network``
and no WDT: both steps are skipped and said so.
"""
import time

import qfagent
from edge.runtime.sensors import Periodic, span


def wifi(cfg, tries=8):
    """Join the configured network; True when connected (or when the port has no Wi-Fi at all)."""
    try:
        import network
    except ImportError:
        print("qf: no network module (emulated board): using the host's network")
        return True
    w = cfg.get("wifi")
    if not w:
        return True
    sta = network.WLAN(network.STA_IF)
    sta.active(True)
    delay = 500
    for _ in range(tries):
        if sta.isconnected():
            print("qf: wifi up", sta.ifconfig()[0])
            return True
        try:
            sta.connect(w["ssid"], w.get("password", ""))
        except OSError as e:
            print("qf: wifi connect failed: %r" % (e,))
        t = time.ticks_ms()
        while not sta.isconnected() and time.ticks_diff(time.ticks_ms(), t) < delay:
            time.sleep_ms(50)
        delay = min(delay * 2, 30000)
    return sta.isconnected()


def set_clock():
    """Set the board's clock by NTP; True on success. On failure the clock is not trusted: the
    agent runs on integer ticks and takes the backend's time from its config (edge.agent)."""
    try:
        import ntptime
    except ImportError:
        print("qf: no ntptime (emulated board): judging the host's clock")
        return None
    try:
        ntptime.settime()
        return True
    except Exception as e:
        print("qf: NTP failed (%r): time from the backend" % (e,))
        return False


def watchdog(ms):
    """A feed function for ``machine.WDT(timeout=ms)``, or None when the port has none."""
    try:
        from machine import WDT
    except ImportError:
        return None
    try:
        return WDT(timeout=ms).feed
    except Exception:
        return None


class Adc(Periodic):
    """``{"kind": "adc", "pin": 34, "scale": 1.0, "offset": 0.0, "period": 1.0}``: a scaled ADC reading."""

    def __init__(self, spec, t0, period):
        from machine import ADC, Pin
        self.adc = ADC(Pin(spec["pin"]))
        self.scale = spec.get("scale", 1.0)
        self.offset = spec.get("offset", 0.0)
        Periodic.__init__(self, spec["name"], t0, span(spec.get("period", period), 1000))

    def read(self, now):
        return self.adc.read_u16() * self.scale + self.offset


def inputs(rest, now, period):
    out = []
    for name, spec in rest:
        if spec.get("kind") != "adc":
            raise ValueError("unsupported source kind: %r" % (spec.get("kind"),))
        out.append(Adc(spec, now, period))
    return out


def run(path="qf.json"):
    import json
    with open(path) as f:
        cfg = json.load(f)
    board = cfg.get("board", {})
    while not wifi(cfg):
        print("qf: wifi unavailable, retrying")
    synced = set_clock()
    feed = watchdog(board.get("watchdog_ms", 30000)) if board.get("watchdog_ms", 30000) else None
    print("qf: watchdog %s" % ("armed" if feed else "not available"))
    qfagent.main(path, feed, inputs, synced)
