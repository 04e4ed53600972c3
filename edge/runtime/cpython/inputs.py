"""CPython-only sensor inputs (DESIGN.md §7): serial lines via pyserial and a user function.

Same interface as ``edge.runtime.sensors``: ``next_time()`` and ``poll(now)`` -> ``(source, value)``.
"""
import importlib

from edge.runtime import sensors


class SerialLines:
    """Lines ``source,value`` from a serial port (any pyserial URL, e.g. ``loop://``), polled often."""

    def __init__(self, port, t0, baud=115200, every=0.05):
        import serial
        self.port = serial.serial_for_url(port, baudrate=baud, timeout=0)
        self.every = every
        self.t = t0
        self.buf = b""

    def next_time(self):
        return self.t

    def poll(self, now):
        self.t = now + self.every
        self.buf += self.port.read(self.port.in_waiting or 1)
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > 256:        # no newline in sight: line noise, not a reading
            self.buf = b""
        out = []
        for line in lines:
            parts = line.decode(errors="replace").strip().split(",")
            if len(parts) == 2:
                try:
                    out.append((parts[0], float(parts[1])))
                except ValueError:
                    out.append((parts[0], None))   # the agent counts it as a bad sample
        return out


class Function(sensors.Periodic):
    """``call = "module:function"``: ``function(now)`` returns a reading (None skips) every period."""

    def __init__(self, source, call, t0, period):
        module, _, name = call.partition(":")
        try:
            self.fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError("source %s: cannot call %s: %s" % (source, call, e))
        sensors.Periodic.__init__(self, source, t0, period)

    def read(self, now):
        return self.fn(now)


def build(cfg, t0):
    """Every input of a loaded ``device.toml``; serial ports are shared by the sources naming them."""
    specs = cfg["sources"]
    inputs, rest = sensors.make_inputs(specs, list(specs), t0, cfg["period"])
    ports = {}
    for name, spec in rest:
        kind = spec.get("kind")
        if kind == "serial":
            if spec["port"] not in ports:
                ports[spec["port"]] = SerialLines(spec["port"], t0, spec.get("baud", 115200))
        elif kind == "function":
            inputs.append(Function(name, spec["call"], t0, spec.get("period", cfg["period"])))
        else:
            raise ValueError("source %r: unknown kind %r" % (name, kind))
    return inputs + list(ports.values())
