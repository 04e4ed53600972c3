"""HIL fixtures: a real board when ``QF_BOARD=/dev/tty...`` is set, otherwise an emulated one (the
MicroPython unix port behind a pty relay, firmware/emulator.py), driven the same way with mpremote."""
import os
import subprocess
import sys

import pytest

from backend.live.broker import Broker, BrokerError, find_mosquitto
from firmware import boardconfig, build, flash
from hilboard import HEAP, REAL, ROOT, target


def pytest_report_header(config):
    return "HIL target: " + target()


@pytest.fixture(scope="session")
def port(tmp_path_factory):
    print("\nHIL target: " + target())
    if REAL:
        flash.check_port(REAL)
        yield REAL
        return
    folder = tmp_path_factory.mktemp("board")
    relay = subprocess.Popen([sys.executable, "-m", "firmware.emulator", str(folder), "--heap", HEAP], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    pts = relay.stdout.readline().strip()
    assert pts.startswith("/dev/"), pts
    yield pts
    relay.terminate()
    relay.wait(5)


@pytest.fixture(scope="session")
def hil(port, tmp_path_factory):
    """A broker, and the board flashed with the agent and a config pointing at it."""
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))
    d = tmp_path_factory.mktemp("hil")
    host = os.environ.get("QF_BROKER_HOST", "127.0.0.1")
    broker = Broker(str(d / "broker"), "h", ["hil"], host=host).start()
    cfg = {"fleet": "h", "device": "hil", "password": broker.credentials("hil")[1], "host": host,
           "port": broker.device_port, "keepalive": 2, "period": 0.05, "width": 1.0, "outbox": 32,
           "sources": [{"name": "x", "kind": "walk", "start": 0.0, "step": 0.5, "seed": 11}],
           "board": {"watchdog_ms": 8000}}
    if os.environ.get("QF_WIFI_SSID"):
        cfg["wifi"] = {"ssid": os.environ["QF_WIFI_SSID"], "password": os.environ.get("QF_WIFI_PASSWORD", "")}
    path = str(d / "device.json")
    boardconfig.write(boardconfig.check(cfg), path)
    build.build(str(d / "deploy"), path)
    flash.deploy(port, str(d / "deploy"))
    yield broker
    broker.stop()
