"""Firmware build, board config, flash error handling, the Pi service bundle, and `quietfleet fleet`
(DESIGN.md §7). The deploy-and-verify path itself runs in hil_tests against a (emulated) board."""
import json
import os
import subprocess
import sys
import tarfile
import signal
import threading
import time

import pytest
import serial

from firmware import boardconfig, build, flash

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_build_precompiles_the_agent_and_copies_boot_main_and_config(tmp_path):
    cfg = boardconfig.template("esp32")
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(cfg))
    files = build.build(str(tmp_path / "out"), str(path))
    assert {"boot.py", "main.py", "qf.json", "lib/qfagent.mpy", "lib/edge/core/codec.mpy", "lib/umqtt/simple.mpy",
            "lib/qfboard.mpy"} <= set(files)
    assert not [f for f in files if f.startswith("lib/") and f.endswith(".py")]
    with open(tmp_path / "out" / "lib" / "edge" / "agent.mpy", "rb") as f:
        assert f.read(1) == b"M"                  # .mpy header
    assert json.loads((tmp_path / "out" / "qf.json").read_text())["device"] == cfg["device"]
    assert build.manifest_hashes(str(tmp_path / "out")) == files


@pytest.mark.parametrize("bad, msg", [
    ({"device": 3}, "'device' must be a str"),
    ({"port": 70000}, "port"),
    ({"sources": []}, "no sources"),
    ({"sources": [{"name": "t", "kind": "adc"}]}, "integer pin"),
    ({"sources": [{"name": "t", "kind": "laser"}]}, "kind must be one of"),
    ({"wifi": {"password": "x"}}, "wifi"),
    ({"hots": "x"}, "unknown key hots"),
    ({"tls": True}, "unknown key tls"),            # the board agent has no TLS (README, Your own broker)
    ({"user": ""}, "'user' must be a non-empty string"),
])
def test_board_config_errors_name_the_problem(bad, msg):
    cfg = dict(boardconfig.template("pico_w"), **bad)
    with pytest.raises(boardconfig.ConfigError, match=msg):
        boardconfig.check(cfg)
    with pytest.raises(boardconfig.ConfigError, match="unknown board"):
        boardconfig.template("arduino")


def test_missing_port_lists_the_ports_present():
    with pytest.raises(flash.FlashError, match="does not exist. Serial ports present"):
        flash.check_port("/dev/ttyUSB97")


def test_busy_port_is_reported_as_busy():
    master, slave = os.openpty()
    name = os.ttyname(slave)
    holder = serial.Serial(name, exclusive=True)
    try:
        with pytest.raises(flash.FlashError, match="busy"):
            flash.check_port(name)
    finally:
        holder.close()
        os.close(master)
        os.close(slave)


def test_a_device_that_is_not_micropython_is_named_as_such():
    master, slave = os.openpty()
    name = os.ttyname(slave)
    stop = threading.Event()

    def shell():                                  # something else on the line: a shell prompt
        while not stop.is_set():
            try:
                if os.read(master, 1024):
                    os.write(master, b"\r\nbash$ ")
            except OSError:
                return
    t = threading.Thread(target=shell, daemon=True)
    t.start()
    try:
        with pytest.raises(flash.FlashError, match="no MicroPython REPL on"):
            flash.identify(name, timeout=3)
    finally:
        stop.set()
        os.close(slave)
        os.close(master)


def test_cli_flash_reports_a_missing_port_and_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "backend.cli", "flash", "--port", "/dev/ttyNOPE", "--out",
                        str(tmp_path / "fw")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "/dev/ttyNOPE does not exist" in r.stderr


def test_pi_bundle_has_a_systemd_unit_an_install_script_and_the_agent(tmp_path):
    toml = tmp_path / "device.toml"
    toml.write_text('fleet = "f"\ndevice = "pi1"\npassword = "pw"\n[broker]\nhost = "10.0.0.2"\n'
                    '[sources.temp]\nkind = "walk"\n')
    files = flash.pi_bundle(str(toml), str(tmp_path / "pi"))
    assert files == ["agent.tar.gz", "device.toml", "install.sh", "quietfleet-agent.service"]
    unit = (tmp_path / "pi" / "quietfleet-agent.service").read_text()
    assert "ExecStart=/opt/quietfleet/venv/bin/python -m edge.runtime.cpython.runtime /etc/quietfleet/device.toml" in unit
    assert "Restart=always" in unit and "User=quietfleet" in unit and "WantedBy=multi-user.target" in unit
    assert "Description=QuietFleet agent pi1" in unit
    script = (tmp_path / "pi" / "install.sh").read_text()
    assert "paho-mqtt==2.1.0" in script and "systemctl enable --now quietfleet-agent.service" in script
    assert subprocess.run(["sh", "-n", str(tmp_path / "pi" / "install.sh")]).returncode == 0
    with tarfile.open(tmp_path / "pi" / "agent.tar.gz") as tar:
        names = tar.getnames()
    assert "edge/agent.py" in names and "edge/runtime/cpython/runtime.py" in names
    assert not [n for n in names if "micropython" in n or n.endswith(".pyc")]
    bad = tmp_path / "bad.toml"
    bad.write_text('fleet = "f"\n')
    with pytest.raises(flash.FlashError, match="missing 'device'"):
        flash.pi_bundle(str(bad), str(tmp_path / "pi2"))


def test_quietfleet_fleet_and_coordinator_commands(tmp_path):
    from backend.live.broker import BrokerError, find_mosquitto
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))
    fl = subprocess.Popen([sys.executable, "-m", "backend.cli", "fleet", "--micropython", "1", "--cpython", "1",
                           "--dir", str(tmp_path), "--duration", "5", "--period", "0.1"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cred = tmp_path / "broker" / "credentials.json"
    end = time.monotonic() + 10
    while not cred.exists() and time.monotonic() < end:
        time.sleep(0.1)
    co = subprocess.Popen([sys.executable, "-m", "backend.cli", "coordinator", "--credentials", str(cred),
                           "--period", "1", "--query", json.dumps({"id": "t", "kind": "sum", "sources": ["s_m0", "s_c0"],
                                                                   "precision": 8})],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = fl.communicate(timeout=60)
    finally:
        co.send_signal(signal.SIGINT)
        co_out, co_err = co.communicate(timeout=10)
    assert fl.returncode == 0, err
    stats = {line.split(":", 1)[0]: json.loads(line.split(":", 1)[1]) for line in out.splitlines()
             if line.startswith(("m0:", "c0:"))}
    assert stats["m0"]["samples"] >= 10 and stats["c0"]["samples"] >= 10
    assert os.path.getsize(tmp_path / "truth-m0.csv") > 0
    lines = [line for line in co_out.splitlines() if line.startswith('{"stats"')]
    assert lines, (co_out, co_err)
    co_stats = json.loads(lines[-1])["stats"]
    assert co_stats["answers"] >= 2 and co_stats["uplinks"] >= 4, (co_out, co_err)
