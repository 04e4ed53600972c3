"""Static baselines: send-everything and uniform deadband (Olston et al. 2003 §1.2)."""
import math

from backend.coordinator.core import aggregate
from backend.coordinator.core.protocol import Protocol, lagged, range_constraints


class Naive(Protocol):
    """Send every reading: width 0 everywhere, so every change is reported."""
    name = "naive"
    local = True
    replaces = True
    static = True

    def target(self, coord, key):
        return 0.0, []


class Deadband(Protocol):
    """Static uniform allocation: each source gets the narrowest uniform share of its (lag-free) queries."""
    name = "deadband"
    local = True
    replaces = True
    static = True

    def target(self, coord, key):
        return target(coord, key)


def target(coord, key):
    """Deadband's filter for ``key``: the narrowest uniform share of its (lag-free) queries, and their range
    constraints (also what the default adaptive rule's no-regret meter measures against: precision.regret)."""
    width = math.inf
    for qid in coord.by_source.get(key, ()):
        if not lagged(coord.queries[qid]):
            width = min(width, aggregate.uniform_width(coord.queries[qid]))
    return width, range_constraints(coord, key)


PROTOCOLS = {"naive": Naive, "deadband": Deadband, "uniform": Deadband}
