"""Float32 arithmetic for the float32-safe device (DESIGN.md §2): rounding and steps on the float32 grid.

Tests emulate a single-precision board with ``f32`` (edge.core.interval ``rnd``); the backend mirrors
such a board with it and pads by ``step``. Portable (struct only); not needed on a board, whose
hardware rounds.
"""
import struct

INF = float("inf")


def f32(x):
    """``x`` rounded to the nearest float32 (the portable struct round trip); too large: OverflowError."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def step(x, up):
    """The float32 next to the float32 ``x`` towards +inf (``up``) or -inf; infinities stay."""
    if x != x or x == INF or x == -INF:
        return x
    if x == 0:
        tiny = struct.unpack("<f", struct.pack("<I", 1))[0]
        return tiny if up else -tiny
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b += 1 if (x > 0) == up else -1
    return struct.unpack("<f", struct.pack("<I", b))[0]
