"""``quietfleet query add|list|remove``: continuous queries as retained specs on ``qf/<fleet>/q/<id>/spec`` (DESIGN.md §3).

A spec is the JSON of a workload query without its ``id`` (the topic names it), e.g.
``quietfleet query add mean '{"kind": "avg", "sources": ["t0", "t1"], "precision": 0.5}' --broker-dir broker``.
``remove`` publishes the empty retained spec; the backend drops the query and clears its answer.
``list`` shows every retained spec with its latest retained answer.
"""
import json
import sys
import time

import paho.mqtt.client as mqtt

from backend.coordinator.core.queries import QueryError, parse_query
from backend.coordinator.protocols import PROTOCOLS
from edge.core import topics


def _client(host, port, password):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="qf-query-%d" % time.monotonic_ns(),
                    protocol=mqtt.MQTTv311)
    c.username_pw_set("backend", password)
    c.connect(host, port, keepalive=10)
    c.loop_start()
    return c


def check_spec(qid, text):
    """The spec as a dict, validated like the backend does except for which sources exist."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise QueryError("spec is not JSON: %s" % e)
    if not isinstance(spec, dict):
        raise QueryError("spec must be a JSON object")
    spec.pop("id", None)
    srcs = spec.get("sources", "all")
    kinds = sorted({k for cls in PROTOCOLS.values() for k in cls.kinds})    # which the backend runs decides
    parse_query(dict(spec, id=qid), set(srcs) if isinstance(srcs, list) and all(isinstance(s, str) for s in srcs)
                else {"x"}, kinds=kinds)
    return spec


def publish(host, port, password, topic, payload):
    c = _client(host, port, password)
    try:
        c.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def collect(host, port, password, fleet, wait=1.0):
    """Retained specs and answers of ``fleet``: {query: {"spec": .., "answer": ..}}."""
    got = {}

    def on_message(cl, u, m):
        t = topics.parse(m.topic)
        if t is not None and t[1] == "q" and m.payload:
            try:
                got.setdefault(t[2], {})[t[3]] = json.loads(m.payload)
            except ValueError:
                got.setdefault(t[2], {})[t[3]] = m.payload.decode(errors="replace")

    c = _client(host, port, password)
    c.on_message = on_message
    c.subscribe([(topics.query(fleet, "+", "spec"), 1), (topics.query(fleet, "+", "answer"), 0)])
    time.sleep(wait)
    c.disconnect()
    c.loop_stop()
    return got


def query_main(args):
    from backend.spark.service import connection
    try:
        host, port, password = connection(args)
        if args.action in ("add", "remove") and not args.id:
            raise ValueError("query %s needs a query id" % args.action)
        if args.action == "add":
            spec = check_spec(args.id, args.spec if args.spec else sys.stdin.read())
            publish(host, port, password, topics.query(args.fleet, args.id, "spec"), json.dumps(spec))
            print("query %s registered" % args.id)
        elif args.action == "remove":
            publish(host, port, password, topics.query(args.fleet, args.id, "spec"), b"")
            print("query %s removed" % args.id)
        else:
            for qid, d in sorted(collect(host, port, password, args.fleet).items()):
                if "spec" in d:
                    print("%s  %s\n    answer: %s" % (qid, json.dumps(d["spec"]), json.dumps(d.get("answer"))))
    except KeyError as e:           # from the broker's credentials.json
        print("quietfleet query: %s/credentials.json lacks %s (write it with quietfleet broker)"
              % (args.broker_dir, e), file=sys.stderr)
        return 2
    except (QueryError, ValueError, OSError) as e:
        print("quietfleet query: %s" % e, file=sys.stderr)
        return 2
    return 0
