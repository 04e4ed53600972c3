"""Every bad input to the real ``quietfleet`` command gets one line on stderr naming what is wrong and a non-zero
exit, never a traceback: protocol parameters, workloads, query specs, device files, credentials, usage."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLEET_WORKLOAD = {"duration": 20, "sources": {"generator": "random_walk", "count": 3},
                  "queries": [{"id": "q", "kind": "avg", "sources": "all", "precision": 2}]}
SUMMARY_WORKLOAD = {"protocol": "aps", "window": 16, "duration": 20,
                    "queries": [{"id": "w", "kind": "summary"}]}
RELAY_WORKLOAD = {"protocol": "relay", "sources": {"generator": "zipf", "items": 200},
                  "queries": [{"id": "c", "kind": "count"}]}
DEVICE = {"fleet": '"f"', "device": '"d1"', "password": '"pw"'}
WALK = '[sources.t]\nkind = "walk"\nstart = 20.0\nstep = 0.1\n'
CRED = {"fleet": "f", "host": "127.0.0.1", "port": 1, "users": {"backend": "x"}}


def fleet(**change):
    """The small fleet workload with top-level keys replaced (``params``, ``protocol``, ...)."""
    return dict(FLEET_WORKLOAD, **change)


def device_toml(drop=(), extra="", sources=WALK):
    return "".join("%s = %s\n" % (k, v) for k, v in DEVICE.items() if k not in drop) + extra + sources


# (case, command line with {w} for a workload file and {d} for the temporary folder, workload or file text,
#  what the one line must name)
SIM = [
    ("cap under the default rule", fleet(protocol="adaptive", params={"cap": 0.2}), "cap"),
    ("guard not a number", fleet(protocol="adaptive", params={"guard": "abc"}), "guard"),
    ("every negative", fleet(protocol="adaptive", params={"every": -5}), "every"),
    ("every under rule shrink", fleet(protocol="adaptive", params={"rule": "shrink", "every": 5}), "every"),
    ("unknown rule", fleet(protocol="adaptive", params={"rule": "fast"}), "rule"),
    ("seed not an integer", fleet(protocol="adaptive", params={"seed": [1]}), "seed"),
    ("unknown models", fleet(params={"models": "cubic"}), "models"),
    ("unknown parameter", fleet(protocol="adaptive", params={"nonsense": 1}), "params.nonsense"),
    ("brownian capacity", fleet(protocol="brownian", params={"capacity": "x"}), "capacity"),
    ("brownian window k", fleet(protocol="brownian", params={"k": 2}), "k"),
    ("optimal steps", fleet(protocol="optimal_static", params={"steps": 3}), "steps"),
    ("entity choice", fleet(protocol="ft-nrp", queries=[{"id": "r", "kind": "range", "range": [0, 1]}],
                            params={"choice": "nearest"}), "choice"),
    ("summary alpha", dict(SUMMARY_WORKLOAD, params={"alpha": -1}), "alpha"),
    ("summary window in params", dict(SUMMARY_WORKLOAD, params={"window": 8}), "params.window"),
    ("relay delta", dict(RELAY_WORKLOAD, relays={"delta": -1}), "delta"),
    ("unknown protocol", fleet(protocol="psychic"), "psychic"),
    ("unknown top-level key", fleet(netwrk={"delay": 1}), "netwrk"),
    ("bad query kind", fleet(queries=[{"id": "q", "kind": "median", "sources": "all", "precision": 1}]), "median"),
    ("precision not a number", fleet(queries=[{"id": "q", "kind": "avg", "sources": "all", "precision": "x"}]),
     "precision"),
    ("missing trace", fleet(sources={"trace": "nowhere.csv"}), "nowhere.csv"),
    ("not JSON", "{not json", "JSON"),
]
OTHER = [
    ("missing workload", ["sim", "{d}/absent.json"], None, "absent.json"),
    ("workload is a folder", ["sim", "{d}"], None, "{d}"),
    ("output into no folder", ["sim", "{w}", "--out", "{d}/no/such/r.json"], FLEET_WORKLOAD, "no/such"),
    ("unknown command option", ["sim", "{w}", "--colour"], FLEET_WORKLOAD, "--colour"),
    ("query spec not JSON", ["query", "add", "q", "{nope", "--fleet", "f", "--port", "1", "--password", "x"], None,
     "JSON"),
    ("query spec kind", ["query", "add", "q", '{"kind": "median", "sources": ["a"]}', "--fleet", "f", "--port", "1",
                         "--password", "x"], None, "median"),
    ("query spec an array", ["query", "add", "q", "[1]", "--fleet", "f", "--port", "1", "--password", "x"], None,
     "object"),
    ("query add without an id", ["query", "add", "--fleet", "f", "--port", "1", "--password", "x"], None, "id"),
    ("query without a broker", ["query", "list", "--fleet", "f"], None, "--port"),
    ("query credentials lack a key", ["query", "list", "--broker-dir", "{d}"], None, "lacks 'host'"),
    ("agent without --config", ["agent"], None, "--config"),
    ("agent config missing", ["agent", "--config", "{d}/absent.toml"], None, "absent.toml"),
    ("agent config not TOML", ["agent", "--config", "{w}"], "fleet = ", "TOML"),
    ("agent config missing key", ["agent", "--config", "{w}"], device_toml(drop=("password",)), "password"),
    ("agent sources = 5", ["agent", "--config", "{w}"], device_toml(sources="sources = 5\n"), "sources"),
    ("agent unknown sensor kind", ["agent", "--config", "{w}"], device_toml(sources='[sources.t]\nkind = "laser"\n'),
     "laser"),
    ("agent start not a number", ["agent", "--config", "{w}"],
     device_toml(sources='[sources.t]\nkind = "walk"\nstart = "abc"\n'), "sources.t.start"),
    ("agent missing CSV", ["agent", "--config", "{w}"],
     device_toml(sources='[sources.t]\nkind = "csv"\npath = "gone.csv"\n'), "gone.csv"),
    ("agent unknown section", ["agent", "--config", "{w}"], device_toml(extra='[brokr]\nport = 1883\n'), "brokr"),
    ("agent unknown key", ["agent", "--config", "{w}"], device_toml(extra='perod = 1.0\n'), "perod"),
    ("agent unknown broker key", ["agent", "--config", "{w}"], device_toml(extra='[broker]\nprot = 1883\n'),
     "broker.prot"),
    ("agent port not a number", ["agent", "--config", "{w}"], device_toml(extra='[broker]\nport = "x"\n'),
     "broker.port"),
    ("agent function not importable", ["agent", "--config", "{w}"],
     device_toml(sources='[sources.t]\nkind = "function"\ncall = "no_such_module:read"\n'), "no_such_module"),
    ("coordinator credentials missing", ["coordinator", "--credentials", "{d}/absent.json"], None, "absent.json"),
    ("coordinator credentials lack a key", ["coordinator", "--credentials", "{w}"], {"fleet": "f"}, "host"),
    ("coordinator query not JSON", ["coordinator", "--credentials", "{w}", "--query", "{x"],
     {"fleet": "f", "host": "127.0.0.1", "port": 1, "users": {"backend": "x"}}, "JSON"),
    ("backend protocol parameter", ["backend", "--fleet", "f", "--port", "1", "--password", "x", "--protocol",
                                    "adaptive", "--param", "cap=0.2"], None, "cap"),
    ("experiment unknown", ["experiment", "nope"], None, "nope"),
    ("coordinator query without an id", ["coordinator", "--credentials", "{w}", "--query", '{"kind": "sum"}'], CRED,
     '"id"'),
    ("coordinator query kind its protocol lacks", ["coordinator", "--credentials", "{w}", "--query",
                                                   '{"id": "r", "kind": "range", "range": [0, 1]}'], CRED,
     "protocol adaptive"),
    ("coordinator unknown protocol", ["coordinator", "--credentials", "{w}", "--protocol", "psychic"], CRED, "psychic"),
    ("coordinator without a broker", ["coordinator", "--fleet", "f"], None, "--port"),
    ("broker dir and credentials both", ["backend", "--broker-dir", "{d}", "--credentials", "{w}"], CRED, "not both"),
    ("TLS CA missing", ["query", "list", "--fleet", "f", "--password", "x", "--tls-ca", "{d}/none.crt"], None,
     "none.crt"),
    ("TLS key without a certificate", ["query", "list", "--fleet", "f", "--password", "x", "--tls-key", "{w}"], "k",
     "--tls-key needs --tls-cert"),
    ("query, nothing listening", ["query", "list", "--fleet", "f", "--port", "1", "--password", "x"], None,
     "cannot reach the broker at 127.0.0.1:1"),
    ("agent certificate without tls", ["agent", "--config", "{w}"], device_toml(extra='[broker]\ncert = "c.crt"\n'),
     "broker.cert needs broker.tls"),
    ("agent key file missing", ["agent", "--config", "{w}"],
     device_toml(extra='[broker]\ntls = true\ncert = "input.toml"\nkey = "nokey.pem"\n'), "nokey.pem"),
    ("agent broker user not a string", ["agent", "--config", "{w}"], device_toml(extra='[broker]\nuser = 5\n'),
     "broker.user"),
]
CASES = [(name, ["sim", "{w}", "--quiet"], w, why) for name, w, why in SIM] + OTHER


def run(tmp_path, argv, content):
    path = tmp_path / ("input.toml" if argv[0] == "agent" else "input.json")
    (tmp_path / "credentials.json").write_text('{"fleet": "f"}')     # a broker folder missing its keys
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    argv = [a.replace("{w}", str(path)).replace("{d}", str(tmp_path)) for a in argv]
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "backend.cli"] + argv, cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_table_is_long_enough():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,argv,content,why", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, name, argv, content, why):
    r = run(tmp_path, argv, content)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.returncode != 0 and len(lines) == 1, (r.returncode, r.stderr)
    assert lines[0].startswith("quietfleet") and why.replace("{d}", str(tmp_path)) in lines[0], lines[0]


def test_a_good_workload_still_runs(tmp_path):
    r = run(tmp_path, ["sim", "{w}", "--quiet"], fleet(protocol="adaptive", params={"rule": "shrink", "cap": 0.2}))
    assert r.returncode == 0 and r.stderr == "", r.stderr
