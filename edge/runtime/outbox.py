"""Outbox bounded in messages and bytes for uplinks held while the broker is unreachable (DESIGN.md §3 reconnect).

Over either bound, the oldest message that a newer one of the same kind and source supersedes is dropped
(the newest report of each source is kept); only if there is none, the oldest message overall. The byte
budget is what bounds a board's heap: one message may be a 4 KB segment batch (edge.core.segment), so a
count alone lets a slow broker fill the heap. Every uplink has a sequence number, so a dropped one is a
gap the backend sees (a dropped segment batch never leaves a silent hole: its stretch is degraded until the
birth sent on reconnect resynchronises every source). ``shed`` frees the older half (out of memory).
Portable: MicroPython and CPython.
"""
from edge.core import codec

BUDGET = 8192           # bytes of payload kept by default: a small board's share of its heap


def _key(payload):
    """What a newer message supersedes this one by: its kind and, of a kind whose first field is a source, that
    source, as one small integer read from the header (a segment batch is not decoded to be queued: ~40 dicts on a
    board's heap); None for what is not a payload of ours."""
    kind = codec.NAMES.get(payload[1]) if len(payload) > 2 and payload[0] == codec.VERSION else None
    if kind is None:
        return None
    return payload[1] << 9 | (payload[2] if codec.SCHEMAS[kind][3].startswith("src ") else 256)


class Outbox:
    def __init__(self, size, budget=BUDGET):
        if size < 1:
            raise ValueError("outbox size must be at least 1")
        if budget < 1:
            raise ValueError("outbox budget must be at least 1 byte")
        self.size = size
        self.budget = budget
        self.items = []          # (key, payload), oldest first
        self.count = {}          # key -> number of its messages in items
        self.bytes = 0           # payload bytes in items
        self.dropped = 0

    def __len__(self):
        return len(self.items)

    def push(self, payload):
        if len(payload) > self.budget:      # could only go alone: it goes, what is kept stays
            self.dropped += 1
            return
        key = _key(payload)
        self.items.append((key, payload))
        self.count[key] = self.count.get(key, 0) + 1
        self.bytes += len(payload)
        while len(self.items) > self.size or self.bytes > self.budget:
            drop = 0
            for j in range(len(self.items)):
                if self.count[self.items[j][0]] > 1:
                    drop = j
                    break
            self._remove(drop)
            self.dropped += 1

    def _remove(self, j):
        key, payload = self.items.pop(j)
        self.count[key] -= 1
        if not self.count[key]:
            del self.count[key]
        self.bytes -= len(payload)
        return payload

    def shed(self):
        """Drop the older half (at least one message): the heap ran out."""
        n = (len(self.items) + 1) // 2
        for _ in range(n):
            self._remove(0)
        self.dropped += n

    def peek(self):
        """The oldest payload; ``pop`` it once the transport has taken it."""
        return self.items[0][1]

    def pop(self):
        return self._remove(0)
