"""The live system without the simulator (DESIGN.md §1, §3, §7): Mosquitto, the live coordinator, emulated fleets.

``broker`` (Mosquitto with per-device passwords and ACLs), ``coordinator`` (the live coordinator loop over
MQTT), ``fleet`` (the one device launcher, every emulated kind), ``demo`` (``quietfleet demo``),
``netfault`` (a TCP proxy that cuts and delays the network for fault tests) and ``queryctl``
(``quietfleet query``). The Spark backend is ``backend.spark``.
"""
