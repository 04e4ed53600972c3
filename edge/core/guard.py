"""The guard after a report (DESIGN.md §4 precision, ``GUARDED``): whether a reading leaves the hull of the bound
before the report and its value within the guard time; one check for the agent and its deadband meter's shadows.

Portable (MicroPython, CPython), float32-safe (comparisons only). A module of its own: the micro:bit loads
edge/core/interval.py into its 16 KB heap, and one more function there no longer fits (tests/microbit)."""


def guarded(guards, i, t, v):
    """Whether reading ``v`` at ``t`` leaves source ``i``'s guard hull ``guards[i]`` = (until, lo, hi); a guard
    past its time is dropped (False)."""
    g = guards[i]
    if t > g[0]:
        del guards[i]
        return False
    return v < g[1] or v > g[2]
