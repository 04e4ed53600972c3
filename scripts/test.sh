#!/usr/bin/env bash
# Set up, then run every test: pytest under CPython and the portable edge tests under MicroPython.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== edge tests under MicroPython (unix port) =="
MICROPYPATH="$PWD:$PWD/tests/edge:.frozen" .venv/bin/micropython -X heapsize=32M tests/edge/mp_runner.py tests/edge/test_*.py
echo "== full suite under CPython (pytest) =="
.venv/bin/python -m pytest "$@"
