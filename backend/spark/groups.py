"""Query groups for the Spark job (issue #21, DESIGN.md §6): connected components of devices, sources and queries.

Two devices belong to one group when a query names sources of both (a device's sources always share
its group: its sequence numbers and downlink need a single owner). A ``"sources": "all"`` query joins
everything, present and future; a device no query touches is a group of its own. Each group is one
Spark state key with its own ``backend.host.Host``, so independent groups run in parallel and each
allocates precision at its own cadence (the protocol runs per Host).

``components`` is the pure function (union-find over one spec set). ``Router`` folds the spool in
offset order and names the group(s) of every record; it is the job's routing table:

* ``up``/``state`` go to the device's group, and ``ctl`` (a downlink's echo) too once it has one; a
  spec to its query's group; ``tick`` and ``link`` to every group holding a query; ``inc`` to every group (a new group gets the latest ``inc``, and
  ``link lost`` while the link is down, before its first record).
* Merges: when a birth or a spec joins two groups, the younger one's key is retired (its state is
  dropped), its queries are registered again in the older one and each of its devices is adopted
  there (asked for a fresh birth, as after a coordinator restart), so the older group rebuilds their
  state from the devices themselves. No coordinator state moves between keys: a Host stays the
  object the simulator runs.
* Splits: when a query is removed or narrowed (or a ``"sources": "all"`` query no longer joins
  everything) and its group falls apart into components, the group's key is retired after the spec
  (its Host retracts the query first) and each component becomes a group of a fresh key
  (``g/<n>``), which gets the component's queries and adopts its devices, as in a merge.

Group ids are the name of the component's oldest node (``d/<device>``, ``s/<source>``, ``q/<query>``)
or, after a split, ``g/<n>`` (``n`` counts the table's nodes), so routing is a deterministic function
of the spool prefix; ``Journal`` keeps the records that changed the table, with their offsets, and
rebuilds it for a restart at any planned offset.
"""
import json
import os
import pickle
import struct

from edge.core import codec, topics


def components(specs, devices):
    """``{device: group}`` for query specs ``{qid: spec}`` and devices ``{device: [sources]}``; a
    group is named by its smallest device name. Deterministic; ``"all"`` joins every device."""
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        a, b = find(a), find(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    owner = {}
    for device in sorted(devices):
        find(("d", device))
        for s in devices[device]:
            union(("d", device), ("s", s))
    for qid in sorted(specs):
        srcs = specs[qid].get("sources", "all")
        nodes = [("d", d) for d in sorted(devices)] if srcs == "all" else [("s", s) for s in srcs]
        for n in nodes:
            union(("q", qid), n)
    for device in sorted(devices):
        root = find(("d", device))
        owner[root] = min(owner.get(root, device), device)
    return {device: owner[find(("d", device))] for device in devices}


class Router:
    """The routing table of one fleet's spool: ``route`` a record in offset order, get its rows."""

    def __init__(self):
        self.parent = {}        # node -> parent node (a root names its group)
        self.age = {}           # node -> creation index: the older root survives a merge
        self.info = {}          # root -> {"devices": [...], "queries": [...], "new"} (creation order)
        self.queried = {}       # roots of the groups holding a query, in order: where ticks and links go
        self.routed = set()     # devices some group's Host has seen a record of
        self.specs = {}         # qid -> latest spec payload (registered again when its group moves)
        self.sources = {}       # device -> the source names its births named (what a split regroups by)
        self.everyone = None    # a node of the group of a "sources: all" query (None: none)
        self.inc = None         # the latest ``inc`` payload, given to every new group first
        self.link = None        # b"lost" while the bridge's link is down

    # -- union-find ---------------------------------------------------------------------------
    def find(self, x):
        parent = self.parent
        if x not in parent:
            parent[x] = x
            self.age[x] = len(self.age)
            kind = x[0]
            self.info[x] = {"devices": [x[2:]] if kind == "d" else [], "queries": [x[2:]] if kind == "q" else [],
                            "new": True}
            if kind == "q":
                self.queried[x] = None
            if self.everyone is not None:
                self._union(self.everyone, x, [])
                return self.find(x)
            return x
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def _union(self, a, b, out):
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        if self.age[b] < self.age[a]:
            a, b = b, a
        self.parent[b] = a
        gone = self.info.pop(b)
        if self.queried.pop(b, 1) is None:
            self.queried.setdefault(a, None)
        keep = self.info[a]
        keep["devices"] += gone["devices"]
        keep["queries"] += gone["queries"]
        if not gone["new"]:
            out.append((b, None, "retire", b""))
        for qid in gone["queries"]:
            if qid in self.specs:
                self._to(a, (qid, "spec", self.specs[qid]), out)
        for device in gone["devices"]:
            if device in self.routed:
                self._to(a, (device, "adopt", b""), out)

    # -- routing ------------------------------------------------------------------------------
    def route(self, device, channel, payload):
        """``(rows, changed)``: rows ``(group, name, channel, payload)`` to feed, in order, for one spool
        record (group None: no group's, a foreign record); ``changed``: whether the record may have
        changed the table (then it belongs in the journal ``replay`` takes)."""
        nodes = len(self.age)
        out = []
        if channel in ("up", "state") and device:
            node = "d/" + device
            for s in _birth_sources(payload) if channel == "state" else ():
                known = self.sources.setdefault(device, [])
                if s not in known:
                    known.append(s)
                self._union(node, "s/" + s, out)
            root = self.find(node)
            self.routed.add(device)
            self._to(root, (device, channel, payload), out)
        elif channel == "ctl" and device:
            if device in self.routed:       # a downlink's echo: to the group its device is in
                self._to(self.find("d/" + device), (device, channel, payload), out)
        elif channel == "spec" and device:
            node = "q/" + device
            srcs = _spec_sources(payload)
            before = _spec_sources(self.specs[device]) if device in self.specs else []
            if srcs == "all":
                self.everyone = self.everyone or node
                for root in list(self.info):
                    self._union(node, root, out)
            for s in srcs if isinstance(srcs, list) else ():
                self._union(node, "s/" + s, out)
            if srcs is None:
                self.specs.pop(device, None)
            else:
                self.specs[device] = payload
            root = self.find(node)
            self._to(root, (device, channel, payload), out)
            if before == "all" and srcs != "all" and self.everyone == node:
                self.everyone = next(("q/" + q for q in sorted(self.specs) if _spec_sources(self.specs[q]) == "all"), None)
            if _lets_go(before, srcs):
                self._split(root, out)      # its group may fall apart
        elif channel in topics.SPOOL_CHANNELS:
            if channel == "inc":
                self.inc = payload
            elif channel == "link":
                self.link = payload if payload == b"lost" else None
            for root in list(self.info if channel == "inc" else self.queried):
                self._to(root, (None, channel, payload), out)
        else:
            out.append((None, device, channel, payload))      # foreign: counted by no group
        return out, channel in ("state", "spec", "inc", "link") or len(self.age) != nodes

    def _split(self, root, out):
        """Regroup the nodes of group ``root`` by the links that remain (births and current specs);
        if they fall apart, retire ``root`` and give each component a fresh group."""
        if self.everyone is not None:
            return                          # a "sources: all" query still joins everything
        members = [x for x in self.parent if x[0] != "g" and self.find(x) == root]
        local = {x: x for x in members}

        def top(x):
            while local[x] != x:
                local[x] = local[local[x]]
                x = local[x]
            return x

        def link(a, b):
            if a in local and b in local:
                local[top(b)] = top(a)
        for x in members:
            if x[0] == "d":
                for s in self.sources.get(x[2:], ()):
                    link(x, "s/" + s)
            elif x[0] == "q" and x[2:] in self.specs:
                for s in _spec_sources(self.specs[x[2:]]) or ():
                    link(x, "s/" + s)
        parts = {}
        for x in members:                   # in creation order: deterministic, oldest node first
            parts.setdefault(top(x), []).append(x)
        real = [p for p in parts.values() if any(x[0] == "d" or x[2:] in self.specs and x[0] == "q" for x in p)]
        if len(real) < 2:
            return
        for p in parts.values():            # sources no one names any more, a removed query: kept along
            if p not in real:
                real[0] += p
        gone = self.info.pop(root)
        self.queried.pop(root, None)
        if not gone["new"]:
            out.append((root, None, "retire", b""))
        order = {x: i for i, x in enumerate(["d/" + d for d in gone["devices"]] + ["q/" + q for q in gone["queries"]])}
        for part in real:
            new = "g/%d" % len(self.age)
            self.parent[new] = new
            self.age[new] = len(self.age)
            for x in part:
                self.parent[x] = new
            names = sorted((x for x in part if x[0] in "dq"), key=lambda x: order.get(x, len(order)))
            queries = [x[2:] for x in names if x[0] == "q" and x[2:] in self.specs]
            self.info[new] = {"devices": [x[2:] for x in names if x[0] == "d"], "queries": queries, "new": True}
            if queries:
                self.queried[new] = None
            for qid in queries:
                self._to(new, (qid, "spec", self.specs[qid]), out)
            for device in self.info[new]["devices"]:
                if device in self.routed:
                    self._to(new, (device, "adopt", b""), out)

    def _to(self, root, row, out):
        info = self.info[root]
        if info["new"]:
            info["new"] = False
            if self.inc is not None and row[1] != "inc":
                out.append((root, None, "inc", self.inc))
            if self.link is not None and row[1] != "link":
                out.append((root, None, "link", self.link))
        out.append((root,) + row)

    def replay(self, journal):
        """Apply journal records ``(device, channel, payload)`` (outputs discarded)."""
        for device, channel, payload in journal:
            self.route(device, channel, payload)


def _birth_sources(payload):
    """The source names of a birth (part) payload; [] for anything else."""
    try:
        kind, m = codec.decode(bytes(payload or b""))
    except codec.CodecError:
        return []
    return [r["name"] for r in m["sources"]] if kind == "birth" else []


def _lets_go(before, after):
    """Whether a spec naming ``after`` (``_spec_sources``) lets go of something its predecessor, naming
    ``before``, joined: a removal, "all" narrowed to a list, or a list that drops a source."""
    if before == "all":
        return after != "all"
    return after != "all" and bool(set(before) - set(after or ()))


def _spec_sources(payload):
    """A spec's ``sources`` (a list of names or ``"all"``), [] for a bad spec, None for a removal."""
    if payload is None or not bytes(payload).strip():
        return None
    try:
        spec = json.loads(bytes(payload))
    except ValueError:
        return []
    srcs = spec.get("sources", "all") if isinstance(spec, dict) else []
    if srcs == "all":
        return "all"
    return [s for s in srcs if isinstance(s, str)] if isinstance(srcs, list) else []


class Journal:
    """The records that changed a ``Router``, with their spool offsets, in ``<directory>/journal``
    (length-prefixed pickled lists, one per batch, fsynced): what rebuilds the table after a restart."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "journal")

    def router(self, start):
        """The ``Router`` as of spool offset ``start``: replay the entries below it and drop the rest
        (a batch planned but never committed is planned again)."""
        entries, torn = self._entries()
        keep = [e for e in entries if e[0] < start]
        router = Router()
        router.replay(e[1:] for e in keep)
        if torn or len(keep) != len(entries):
            tmp = self.path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(_frame(keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        return router

    def append(self, entries):
        """Entries ``(offset, device, channel, payload)`` of one batch."""
        if entries:
            with open(self.path, "ab") as f:
                f.write(_frame(entries))
                f.flush()
                os.fsync(f.fileno())

    def _entries(self):
        """``(entries, torn)``: every whole frame's entries; ``torn``: bytes follow the last whole frame
        (a crash mid-append, of a batch never planned)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], False
        pos, out = 0, []
        while pos + 4 <= len(data):
            n = struct.unpack_from(">I", data, pos)[0]
            if pos + 4 + n > len(data):
                break
            out += pickle.loads(data[pos + 4:pos + 4 + n])
            pos += 4 + n
        return out, pos != len(data)


def _frame(entries):
    blob = pickle.dumps(list(entries), protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack(">I", len(blob)) + blob
