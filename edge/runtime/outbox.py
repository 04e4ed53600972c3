"""Bounded outbox for uplink messages held while the broker is unreachable (DESIGN.md §3 reconnect).

When full, the oldest message that a newer one of the same kind and source supersedes is dropped
(the newest report of each source is kept); only if there is none, the oldest message overall. The birth sent on
reconnect re-centres every source, so dropped reports never leave the backend with a wrong bound.
Portable: MicroPython and CPython.
"""
from edge.core import codec


def _key(payload):
    try:
        kind, m = codec.decode(payload)
    except codec.CodecError:
        return None
    return (kind, m.get("src"))


class Outbox:
    def __init__(self, size):
        if size < 1:
            raise ValueError("outbox size must be at least 1")
        self.size = size
        self.items = []          # (key, payload), oldest first
        self.count = {}          # key -> number of its messages in items
        self.dropped = 0

    def __len__(self):
        return len(self.items)

    def push(self, payload):
        key = _key(payload)
        self.items.append((key, payload))
        self.count[key] = self.count.get(key, 0) + 1
        if len(self.items) > self.size:
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
        return payload

    def peek(self):
        """The oldest payload; ``pop`` it once the transport has taken it."""
        return self.items[0][1]

    def pop(self):
        return self._remove(0)
