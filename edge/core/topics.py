"""MQTT topic names of DESIGN.md §3, the one spelling both the devices and the backend use.

``qf/<fleet>/d/<device>/{up,ctl,state}`` per device, ``qf/<fleet>/q/<query>/{spec,answer,final}`` per query
(``answer``: the latest provisional answer, ``final``: the latest final answer, DESIGN.md §4),
``qf/<fleet>/{tick,link,inc}`` for the spool's own records (the bridge's clock, its broker link, a new
backend run), which no device or user publishes, and ``qf/<fleet>/backend/state`` for the backend's own
online/offline state (its Last Will; ``backend.live.presence``). Portable: runs unchanged on MicroPython.
"""
ROOT = "qf"
DEVICE_CHANNELS = ("up", "ctl", "state")
QUERY_CHANNELS = ("spec", "answer", "final")
SPOOL_CHANNELS = ("tick", "link", "inc", "sent")


def device(fleet, dev, channel):
    """``qf/<fleet>/d/<dev>/<channel>``; ``dev`` may be ``+`` (a subscription) or ``%u`` (an ACL pattern)."""
    return "%s/%s/d/%s/%s" % (ROOT, fleet, dev, channel)


def device_prefix(fleet, dev):
    """``qf/<fleet>/d/<dev>/``: a device appends its channel."""
    return "%s/%s/d/%s/" % (ROOT, fleet, dev)


def query(fleet, qid, channel):
    """``qf/<fleet>/q/<qid>/<channel>``; ``qid`` may be ``+``."""
    return "%s/%s/q/%s/%s" % (ROOT, fleet, qid, channel)


def tick(fleet):
    return spool(fleet, "tick")


def spool(fleet, channel):
    """``qf/<fleet>/<channel>`` for one of ``SPOOL_CHANNELS``."""
    return "%s/%s/%s" % (ROOT, fleet, channel)


def backend(fleet):
    """``qf/<fleet>/backend/state``: the backend's online state and Last Will (``backend.live.presence``)."""
    return "%s/%s/backend/state" % (ROOT, fleet)


def fleet_root(fleet):
    """``qf/<fleet>/``: everything of one fleet lies below it."""
    return "%s/%s/" % (ROOT, fleet)


def fleet_all(fleet):
    """``qf/<fleet>/#``: a subscription (or ACL rule) for every topic of one fleet."""
    return "%s/%s/#" % (ROOT, fleet)


def parse(topic):
    """``(fleet, scope, name, channel)`` for a QuietFleet topic, scope ``"d"``, ``"q"``, one of
    ``SPOOL_CHANNELS`` (``name`` and ``channel`` None then) or ``"backend"`` (``(fleet, "backend", None,
    "state")``); None for anything else."""
    parts = topic.split("/")
    if len(parts) == 3 and parts[0] == ROOT and parts[2] in SPOOL_CHANNELS:
        return parts[1], parts[2], None, None
    if len(parts) == 4 and parts[0] == ROOT and parts[2] == "backend" and parts[3] == "state":
        return parts[1], "backend", None, "state"
    if len(parts) != 5 or parts[0] != ROOT or not parts[3]:
        return None
    if parts[2] == "d" and parts[4] in DEVICE_CHANNELS or parts[2] == "q" and parts[4] in QUERY_CHANNELS:
        return parts[1], parts[2], parts[3], parts[4]
    return None
