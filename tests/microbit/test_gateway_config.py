"""The gateway's JSON config (edge/runtime/gateway/config.py): every bad key or value is one line naming it and
exit 2 from the real command, never a traceback; the broker user, client id and TLS files default as README says."""
import json
import os
import subprocess
import sys

import pytest

from edge.runtime.gateway import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = {"fleet": "f", "gateway": "gw1", "password": "pw", "port": 1883, "sensors": [{"name": "mb0", "port": "/dev/x"}]}

CASES = [
    ("unknown key", dict(GOOD, hots="x"), "hots"),
    ("missing password", {k: v for k, v in GOOD.items() if k != "password"}, "password"),
    ("port a string", dict(GOOD, port="1883"), "port"),
    ("port out of range", dict(GOOD, port=70000), "port must be 1..65535"),
    ("no sensors", dict(GOOD, sensors=[]), "no sensors"),
    ("sensor without a port", dict(GOOD, sensors=[{"name": "mb0"}]), "sensors[0]"),
    ("unknown sensor key", dict(GOOD, sensors=[{"name": "mb0", "port": "/dev/x", "baud": 9}]), "sensors[0].baud"),
    ("unknown relay parameter", dict(GOOD, relay={"h": 30, "spread": 2}), "relay.spread"),
    ("ca without tls", dict(GOOD, ca="ca.crt"), "ca needs"),
    ("ca missing", dict(GOOD, tls=True, ca="nowhere.crt"), "nowhere.crt"),
    ("key without cert", dict(GOOD, tls=True, key="cfg.json"), "key needs cert"),
    ("run_for zero", dict(GOOD, run_for=0), "run_for"),
    ("password null", dict(GOOD, password=None), "password must be a string"),
]


@pytest.mark.parametrize("name,cfg,why", CASES, ids=[c[0] for c in CASES])
def test_a_bad_gateway_config_is_one_line(tmp_path, name, cfg, why):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "edge.runtime.gateway.gateway", str(path)], env=dict(os.environ,
                       PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("gateway: ") and why in lines[0], lines[0]


def test_defaults_and_tls_files(tmp_path):
    cfg = config.check(dict(GOOD, relay=None, truth=None), str(tmp_path / "gw.json"))    # as quietfleet fleet writes it
    assert (cfg["host"], cfg["user"], cfg["client_id"]) == ("127.0.0.1", "gw1", "gw1") and "relay" not in cfg
    (tmp_path / "ca.crt").write_text("x")
    cfg = config.check(dict(GOOD, tls=True, ca="ca.crt", user="hall", client_id="hall-gw"), str(tmp_path / "gw.json"))
    assert cfg["ca"] == str(tmp_path / "ca.crt") and (cfg["user"], cfg["client_id"]) == ("hall", "hall-gw")
