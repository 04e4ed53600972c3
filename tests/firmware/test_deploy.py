"""The agent as a board runs it: from the built deploy folder only (``lib/`` of .mpy files), never
from the repository on MICROPYPATH. A SWAT summary control works there; on a board built without
the optional SWAT module it is counted as unsupported and the agent keeps running (no reset loop)."""
import json
import os
import subprocess

import pytest

from firmware import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICROPYTHON = os.path.join(ROOT, ".venv", "bin", "micropython")

SCRIPT = r"""
import json
from edge.agent import Agent
from edge.core import codec

a = Agent("d", ["t"], 1, 0, 1e9, 1000, False)
a.start(5)
to = a.token
a.handle_message(6, codec.encode("config", {"seq": 1, "inc": 3, "to": to, "period": 0, "shrink": 0.0,
                                             "beat": 0, "t0": 0, "now": 1700000000000, "tick": 0}))
out = a.handle_message(7, codec.encode("summary", {"src": 0, "seq": 2, "inc": 3, "to": to, "window": 16, "k": 1,
                                                    "subs": 1, "read": 1, "pad": []}))
for i in range(20):
    out += a.handle_sample(8 + i, 0, float(i % 5))
kinds = [codec.decode(p)[0] for _, p in out]
print(json.dumps({"kinds": kinds, "stats": a.stats, "offset": a.offset}))
"""


def _run(lib, tmp_path):
    script = tmp_path / "agent_check.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MICROPYPATH=str(lib))
    r = subprocess.run([MICROPYTHON, "-X", "heapsize=64k", str(script)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    if not os.path.exists(MICROPYTHON):
        pytest.skip("no MicroPython unix port in .venv")
    out = tmp_path_factory.mktemp("deploy") / "board"
    build.build(str(out))
    return out


def test_agent_runs_from_the_deploy_folder_alone_with_swat(deploy, tmp_path):
    assert not (deploy / "lib" / "edge" / "agent.py").exists()      # compiled, as on a board
    got = _run(deploy / "lib", tmp_path)
    assert "blob" in got["kinds"] and got["stats"]["unsupported"] == 0
    assert got["offset"] == 1700000000000 - 6                         # no clock: the backend's time


def test_board_without_the_optional_module_counts_it_and_keeps_running(deploy, tmp_path):
    lib = tmp_path / "lib"
    subprocess.run(["cp", "-r", str(deploy / "lib"), str(lib)], check=True)
    os.remove(lib / "edge" / "core" / "swat.mpy")
    os.remove(lib / "edge" / "core" / "swat_asr.mpy")
    got = _run(lib, tmp_path)
    assert got["stats"]["unsupported"] == 1 and "blob" not in got["kinds"]
    assert got["stats"]["samples"] == 20
