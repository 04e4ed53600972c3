"""Bounded outbox for uplink messages held while the broker is unreachable (DESIGN.md §3 reconnect).

When full, a new message replaces the oldest one of the same kind and source (the newest report of
a source supersedes older ones); otherwise the oldest message overall is dropped. The birth sent on
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
        self.dropped = 0

    def __len__(self):
        return len(self.items)

    def push(self, payload):
        key = _key(payload)
        if len(self.items) >= self.size:
            drop = 0
            for j in range(len(self.items)):
                if self.items[j][0] == key:
                    drop = j
                    break
            self.items.pop(drop)
            self.dropped += 1
        self.items.append((key, payload))

    def pop(self):
        """The oldest payload (remove it with ``pop`` only after it was handed to the client)."""
        return self.items.pop(0)[1]

    def peek(self):
        return self.items[0][1]
