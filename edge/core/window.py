"""Which downlinks a device applies: its backend's incarnation and an anti-replay window (DESIGN.md §3).

Shared by the agent (edge.agent) and the micro:bit gateway's bridge (edge.runtime.gateway.bridge).
"""
WINDOW = 30             # downlink sequence numbers remembered below the highest (a small int on a board)
_MASK = (1 << WINDOW) - 1


def current(inc, kind, got):
    """Whether a control of backend incarnation ``got`` may be applied by a device configured by
    incarnation ``inc`` (None: none since its latest birth): one of ``inc`` itself, or a config (or
    ``setup``, or a request for a birth) of a later run (32-bit serial order, RFC 1982), which the
    device then adopts, or, before any config, a ``link`` or ``ack`` (delivery settings, not controls: one
    that overtook the config counts). A replayed control of an earlier run, config or not, is dropped."""
    if got == inc:
        return True
    if inc is None and (kind == "link" or kind == "ack"):
        return True
    later = inc is None or 0 < (got - inc) & 0xFFFFFFFF < 0x80000000
    return (kind == "config" or kind == "setup" or kind == "rebirth") and later


def fresh(top, seen, seq):
    """Anti-replay window (RFC 4303 §3.4.3 style) over downlink sequence numbers: ``top`` the highest
    accepted (None: none yet), bit k of ``seen`` set when top - 1 - k was. Returns (first time seen,
    top, seen)."""
    if top is None:
        return True, seq, 0
    d = (seq - top) & 0xFFFFFFFF
    if d == 0:
        return False, top, seen
    if d < 0x80000000:
        return True, seq, ((seen << d) | (1 << (d - 1))) & _MASK if d <= WINDOW else 0
    back = (top - seq) & 0xFFFFFFFF
    if back > WINDOW or seen >> (back - 1) & 1:
        return False, top, seen
    return True, top, seen | 1 << (back - 1)
