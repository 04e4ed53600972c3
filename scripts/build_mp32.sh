#!/usr/bin/env bash
# Optional (benchmarks): a 32-bit, single-precision MicroPython unix port, the closest stand-in for an
# ESP32/RP2-class board on this machine (4-byte objects, float32 arithmetic). Builds two binaries into
# build/mp32/: micropython-f32 (loads the agent as .mpy, like a board's filesystem) and
# micropython-f32-frozen (the agent frozen into the image, like firmware/manifest.py on a board).
# `python -m backend.bench.edge` reports the agent's heap on them when they exist.
# Usage: scripts/build_mp32.sh [MICROPYTHON_SOURCE_DIR]   (default: clone MICROPYTHON_REF into build/mp32/src)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/build/mp32
REF=${MICROPYTHON_REF:-1c3c201149f37fe8d81246191b3127bb198d6306}
SRC=${1:-$OUT/src}
if ! echo 'int main(){return 0;}' | gcc -m32 -x c - -o /dev/null 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-multilib
fi
if [ ! -d "$SRC/py" ]; then
    git clone --filter=blob:none https://github.com/micropython/micropython "$SRC"
    git -C "$SRC" checkout -q "$REF"
fi
mkdir -p "$SRC/lib/micropython-lib" && touch "$SRC/lib/micropython-lib/README.md"   # only our own manifest is frozen
"$ROOT/.venv/bin/python" - "$ROOT" "$OUT/manifest.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from firmware.build import MODULES
with open(sys.argv[2], "w") as f:
    for rel, src in MODULES:
        # qfboard needs a board; swat.py holds a float literal beyond float32 (1e300) that mpy-tool cannot freeze
        if rel not in ("qfboard.py", "edge/core/swat.py"):
            f.write("module(%r, base_path=%r, opt=1)\n" % (rel, src[:-len(rel)]))
PY
FLAGS=(VARIANT=standard CC="gcc -m32" LD="gcc -m32" MICROPY_PY_FFI=0 MICROPY_PY_BTREE=0 MICROPY_PY_SSL=0
       MICROPY_SSL_MBEDTLS=0 CFLAGS_EXTRA="-DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT")
make -C "$SRC/mpy-cross" -j2 >/dev/null
make -C "$SRC/ports/unix" -j2 "${FLAGS[@]}" FROZEN_MANIFEST= BUILD=build-f32 PROG=micropython-f32 >/dev/null
make -C "$SRC/ports/unix" -j2 "${FLAGS[@]}" FROZEN_MANIFEST="$OUT/manifest.py" BUILD=build-f32-frozen \
    PROG=micropython-f32-frozen >/dev/null
cp "$SRC/ports/unix/build-f32/micropython-f32" "$SRC/ports/unix/build-f32-frozen/micropython-f32-frozen" "$OUT/"
echo "built $OUT/micropython-f32 and $OUT/micropython-f32-frozen"
