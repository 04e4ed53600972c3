"""MicroPython agent: edge.agent.Agent on a reconnecting umqtt.simple link (DESIGN.md §3, §7).

Run on the unix port with ``MICROPYPATH=<repo>:<repo>/edge/runtime/micropython``:
``micropython -X heapsize=32k -m qfagent device.json``; on a board, ``main.py`` calls ``main(path)``.
The config is JSON: ``fleet``, ``device``, ``password``, ``host``, ``port``, ``keepalive``, ``user`` and
``client_id`` (optional: default the device id and ``qf-<fleet>-<device>``; no TLS: see README),
``period``, ``width``, ``outbox`` (messages) and ``outbox_bytes`` (their payload bytes, default
edge.runtime.outbox.BUDGET) kept while the broker is away, ``ground_truth`` (optional path), ``boot`` (optional),
``clock_skew_ms`` (optional: emulate a clock that far ahead of the host's, edge.runtime.pump),
``run_for`` (optional seconds, then stop as on Ctrl-C) and
``sources``: a list of ``{"name": ..., "kind": "walk" | "csv", ...}`` in source-index order.
Ctrl-C (SIGINT) stops cleanly and prints the agent's counters as one JSON line. A MemoryError in the loop is
survived (``Pump.oom``, counted as ``oom``).
Time is integer milliseconds (edge.runtime.clock): the same code runs on a float32 board. Control
messages are acknowledged only after the agent has handled them (link.py).
"""
import gc
import json
import os
import struct
import sys
import time

from edge.agent import Agent
from edge.runtime.clock import Clock
from edge.runtime.outbox import BUDGET, Outbox
from edge.runtime.pump import Pump
from edge.runtime.sensors import make_inputs, span
from link import Link

MAX_WAIT_MS = 500
# A collection after every GC_EVERY bytes allocated, not only when an allocation fails: the heap then fills from
# its bottom again and again, what lives long packs low and large free blocks stay. With collections on failure
# only, long-lived objects were strewn over the whole heap: at 96 KB a 1 KB segment batch found no block with 25 KB
# free, 40-50 MemoryErrors a run (tests/firmware/test_small_heap.py; 0-1 with this, at no measurable cost in samples).
GC_EVERY = 8192


def main(path, hook=None, more_inputs=None, synced=None):
    """Run the agent from the JSON config at ``path`` until Ctrl-C (or ``run_for`` seconds).

    ``hook()`` runs once per loop pass (a board feeds its watchdog there); ``more_inputs(specs,
    now, period)`` builds inputs for source kinds this module does not know (a board's ADC pins);
    ``synced``: whether the board's clock was set (NTP); None judges by the clock's value.
    """
    with open(path) as f:
        cfg = json.load(f)
    clock = Clock(time)
    if synced is None:
        synced = clock.synced
    now = clock()
    specs = {}
    names = []
    for s in cfg["sources"]:
        specs[s["name"]] = s
        names.append(s["name"])
    # A random boot id: a board without a clock restarts at the same time.time(), and a
    # restart within a second must still read as a new boot to the backend.
    boot = cfg.get("boot") or struct.unpack("<I", os.urandom(4))[0]
    try:
        agent = Agent(cfg["device"], names, boot, 0, cfg.get("width", 0.0), 1000, synced)
    except ValueError as e:
        print("qf: bad config: %s" % e)       # no reset loop on a board: stop here
        return
    inputs, rest = make_inputs(specs, names, now, cfg.get("period", 1.0), 1000)
    if rest and more_inputs is not None:
        inputs += more_inputs(rest, now, cfg.get("period", 1.0))
    elif rest:
        raise ValueError("unsupported source kind: %r" % (rest[0][1].get("kind"),))
    truth = open(cfg["ground_truth"], "a") if cfg.get("ground_truth") else None
    link = Link(cfg, agent.will())
    box = Outbox(cfg.get("outbox", 32), cfg.get("outbox_bytes", BUDGET))
    pump = Pump(agent, inputs, box, link.send, truth, cfg.get("clock_skew_ms", 0))
    gc.collect()
    peak = gc.mem_alloc()
    gc.threshold(GC_EVERY)
    stop_at = now + span(cfg["run_for"], 1000) if cfg.get("run_for") else None
    n = 0
    while stop_at is None or now < stop_at:
        try:
            if hook is not None:
                hook()
            n += 1
            if n % 64 == 0:         # live heap after a collection: must stay bounded on a long run
                gc.collect()
                peak = max(peak, gc.mem_alloc())
            if link.up():
                pump.online(clock())
            while link.inbox:
                pid, msg = link.take()
                pump.message(clock(), msg)
                link.ack(pid)           # only now: an acknowledged control is never lost
            now = clock()
            pump.poll(now)
            wake = pump.wake()
            ms = MAX_WAIT_MS if wake is None else wake - clock() + 1
            link.wait(min(max(ms, 0), MAX_WAIT_MS))
            if truth is not None:
                truth.flush()
        except KeyboardInterrupt:
            break
        except MemoryError:         # never a crash (or reset) loop: free what is kept, show the gap, go on
            pump.oom()
            gc.collect()
            now = clock()
    if truth is not None:
        truth.close()
    gc.collect()
    stats = {"outbox": len(pump.outbox), "outbox_dropped": pump.outbox.dropped, "oom": pump.ooms,
             "inbox_overflows": link.overflows,
             "link_failures": link.failures, "heap_free": gc.mem_free(), "heap_used": gc.mem_alloc(), "heap_peak": peak}
    stats.update(agent.stats)
    stats.update(agent.delivery.stats)
    # counters first: saying goodbye waits for the broker's PUBACK, which a loaded broker may not send
    # before the launcher's stop timeout
    print(json.dumps({"stats": stats}))
    link.close(agent.will())


if __name__ == "__main__":
    main(sys.argv[1])
