"""Every protocol the simulator, the live coordinator and the Spark job can run, by name."""
from backend.coordinator.brownian import deferral
from backend.coordinator.precision import adaptive, deadband, estimate, optimal
from backend.coordinator.relay import central
from backend.coordinator.swat import replication
from backend.coordinator.tolerance import entity, fraction, rank

PROTOCOLS = {}
for _module in (deadband, adaptive, estimate, optimal, central, deferral, entity, fraction, rank, replication):
    PROTOCOLS.update(_module.PROTOCOLS)


def make(name, **params):
    """Instantiate the protocol registered under ``name`` with workload ``params``."""
    cls = PROTOCOLS.get(name)
    if cls is None:
        raise ValueError("unknown protocol %r; choose one of %s" % (name, ", ".join(sorted(PROTOCOLS))))
    return cls(**params)
