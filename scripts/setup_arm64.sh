#!/usr/bin/env bash
# Optional: an arm64 (Raspberry Pi class) Debian bookworm root for running the CPython agent under
# QEMU user-mode emulation (DESIGN.md §7, §9). Installs qemu-user-static and mmdebstrap with apt-get
# when missing (needs root), then builds the root once into .cache/arm64-rootfs (ignored by git) from
# the Debian mirror apt already uses. Prints the root's path; idempotent and cheap once built.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${QF_ARM64_ROOTFS:-$PWD/.cache/arm64-rootfs}
if [ -x "$ROOT/usr/bin/python3" ] && [ -f "$ROOT/.qf-ready" ]; then echo "$ROOT"; exit 0; fi
need=()
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "[setup_arm64] missing ${need[*]}: run sudo apt-get install ${need[*]}" >&2; exit 2
  fi
  echo "[setup_arm64] installing ${need[*]}" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The mirror apt uses (deb822 .sources or one-line .list), else the Debian default.
MIRROR=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
[ -n "$MIRROR" ] || MIRROR=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
echo "[setup_arm64] building $ROOT from $MIRROR" >&2
rm -rf "$ROOT.tmp"
mkdir -p "$(dirname "$ROOT")"
mmdebstrap --quiet --mode=root --variant=extract --architectures=arm64 \
  --include=python3,python3-paho-mqtt bookworm "$ROOT.tmp" "$MIRROR" >&2
# Start-up under emulation is ~4x faster with the standard library precompiled.
qemu-aarch64-static -L "$ROOT.tmp" "$ROOT.tmp/usr/bin/python3" -m compileall -q "$ROOT.tmp/usr/lib/python3.11" >/dev/null 2>&1 || true
touch "$ROOT.tmp/.qf-ready"
rm -rf "$ROOT" && mv "$ROOT.tmp" "$ROOT"
echo "$ROOT"
