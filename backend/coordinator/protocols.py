"""Every protocol the simulator, the live coordinator and the Spark job can run, by name."""
from backend.coordinator import baselines, brownian, entity, fraction, optimal, precision, rank, relay, replication

PROTOCOLS = dict(baselines.PROTOCOLS)
PROTOCOLS.update({"adaptive": precision.Adaptive, "optimal_static": optimal.OptimalStatic})
for _module in (relay, brownian, entity, fraction, rank, replication):
    PROTOCOLS.update(_module.PROTOCOLS)


def make(name, **params):
    """Instantiate the protocol registered under ``name`` with workload ``params``."""
    cls = PROTOCOLS.get(name)
    if cls is None:
        raise ValueError("unknown protocol %r; choose one of %s" % (name, ", ".join(sorted(PROTOCOLS))))
    return cls(**params)
