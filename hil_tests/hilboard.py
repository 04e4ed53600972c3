"""HIL helpers: which target the run uses, and starting/finishing the flashed agent through mpremote."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.environ.get("QF_BOARD")
HEAP = os.environ.get("QF_HIL_HEAP", "96k")     # as backend.live.fleet.HEAP; the metered agent peaks near 67 KB


def target():
    if REAL == "qemu-microbit":
        return "QEMU micro:bit (test_microbit.py only)"
    if REAL:
        return "real board on %s" % REAL
    return "emulated board (MicroPython unix port, -X heapsize=%s, pty relay firmware/emulator.py)" % HEAP


def run_agent(port, seconds, **overrides):
    """Start the flashed agent for ``seconds`` through mpremote (as main.py would); returns the Popen."""
    code = ("import json, qfboard\nc = json.load(open('qf.json'))\nc.update(json.loads(%r))\nc['run_for'] = %r\n"
            "json.dump(c, open('run.json', 'w'))\nqfboard.run('run.json')\n") % (
        json.dumps(overrides), seconds)
    return subprocess.Popen([sys.executable, "-m", "mpremote", "connect", port, "exec", code], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout):
    out, err = proc.communicate(timeout=timeout)
    for line in out.splitlines():
        if line.startswith('{"stats"'):
            return json.loads(line)["stats"], out
    raise AssertionError("no stats from the board: %s %s" % (out[-800:], err[-800:]))


def reports_during(be, topic, settle, window):
    """Reports the backend client ``be`` receives on ``topic`` during ``window`` s, after ``settle`` s whose
    messages are dropped (what was in flight when a shutdown was sent)."""
    from edge.core import codec
    time.sleep(settle)
    while not be.inbox.empty():
        be.inbox.get()
    time.sleep(window)
    return [m for m in list(be.inbox.queue) if m[0] == topic and codec.decode(m[1])[0] == "report"]
