"""A loopback TCP proxy that cuts, delays and resets traffic, for live fault tests (DESIGN.md §5 hostile network).

Devices connect to the proxy instead of the broker; the proxy forwards every byte both ways until told
otherwise. ``cut()`` drops traffic in both directions while keeping the connections open (what a
failed Wi-Fi link or a partition looks like to TCP: silence, then a keepalive timeout), ``heal()``
forwards again, ``delay(s)`` holds every chunk for ``s`` seconds (chunks already held included, so
``delay(0)`` releases them at once), ``reset()`` closes every connection
(a broker or NAT restart). The agents keep sampling and logging their ground truth meanwhile, so a
stale window is visible to the checker, unlike a SIGSTOP. ``lossy(loss, duplicate, reorder)`` makes it an
MQTT-aware hostile network (DESIGN.md §5) for device messages (``.../up`` and ``.../ctl`` PUBLISH packets,
either way): each is lost (its QoS 1 PUBACK made up for the sender, as a broker that lost it after
acknowledging), sent twice, or held back up to ``hold`` s so later ones overtake it, by a seeded draw;
every other packet passes in order. It listens on 127.0.0.1 only.
"""
import collections
import math
import random
import selectors
import socket
import threading
import time

_CHUNK = 65536


class _Pair:
    __slots__ = ("down", "up", "queues", "held", "bufs")

    def __init__(self, down, up):
        self.down = down            # the device side
        self.up = up                # the broker side
        self.queues = {down: collections.deque(), up: collections.deque()}   # socket -> [(received, data)] to send
        self.held = {down: [], up: []}      # socket -> [(release time, data)] held back (reordered)
        self.bufs = {down: b"", up: b""}    # socket -> bytes read but not a whole MQTT packet yet


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (host, port) in a background thread until ``close()``."""

    def __init__(self, target, port=0):
        self.target = target
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", port))
        self.lsock.listen(64)
        self.lsock.setblocking(False)
        self.port = self.lsock.getsockname()[1]
        self.host = "127.0.0.1"
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ)
        self.pairs = {}             # socket -> _Pair
        self.lock = threading.Lock()
        self.mode = "pass"          # pass | cut
        self.hold = 0.0             # seconds each chunk is held (delay)
        self.resets = 0
        self.stats = {"connections": 0, "forwarded": 0, "dropped": 0, "resets": 0, "cuts": 0,
                      "lost": 0, "duplicated": 0, "reordered": 0}
        self.faults = None          # (loss, duplicate, reorder, hold) of device PUBLISH packets, or None
        self.rng = random.Random(0)
        self.cut_log = []           # [(start, end or None)] in time.time(), for the checker
        self.stopping = False
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, name="qf-netfault", daemon=True)
        self.thread.start()

    # -- control ---------------------------------------------------------------------------
    def cut(self):
        """Drop every byte both ways from now on; connections stay open."""
        with self.lock:
            if self.mode != "cut":
                self.mode = "cut"
                self.stats["cuts"] += 1
                self.cut_log.append([time.time(), None])

    def heal(self):
        with self.lock:
            if self.mode == "cut":
                self.cut_log[-1][1] = time.time()
            self.mode = "pass"
        self._wake()

    def lossy(self, loss=0.0, duplicate=0.0, reorder=0.0, hold=0.3, seed=0):
        """Lose, duplicate or reorder device PUBLISH packets from now on (all 0: stop)."""
        with self.lock:
            self.rng = random.Random(seed)
            self.faults = (loss, duplicate, reorder, hold) if loss or duplicate or reorder else None

    def delay(self, seconds):
        with self.lock:
            self.hold = max(0.0, float(seconds))
        self._wake()

    def reset(self):
        """Close every proxied connection (both sides see the TCP connection end)."""
        with self.lock:
            self.resets += 1
        self._wake()

    def close(self):
        self.stopping = True
        self._wake()
        self.thread.join(5)

    def _wake(self):
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    # -- loop ------------------------------------------------------------------------------
    def _run(self):
        done_resets = 0
        while not self.stopping:
            resets = self.resets
            if resets != done_resets:
                done_resets = resets
                self.stats["resets"] += 1
                for sock in list(self.pairs):
                    self._drop(sock)
            now = time.monotonic()
            self._flush(now)
            timeout = self._next_release(now)
            for key, _ in self.sel.select(timeout):
                sock = key.fileobj
                if sock is self.lsock:
                    self._accept()
                elif sock is self.wake_r:
                    try:
                        sock.recv(4096)
                    except OSError:
                        pass
                elif sock in self.pairs:
                    self._read(sock)
        for sock in list(self.pairs):
            self._drop(sock)
        self.sel.close()
        self.lsock.close()
        self.wake_r.close()
        self.wake_w.close()

    def _accept(self):
        try:
            down, _ = self.lsock.accept()
        except OSError:
            return
        try:
            up = socket.create_connection(self.target, timeout=2.0)
        except OSError:
            down.close()
            return
        for s in (down, up):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(s, selectors.EVENT_READ)
        pair = _Pair(down, up)
        self.pairs[down] = self.pairs[up] = pair
        self.stats["connections"] += 1

    def _read(self, sock):
        pair = self.pairs[sock]
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        if self.mode == "cut":         # read at each use: a control call may have changed it mid-select
            self.stats["dropped"] += len(data)
            return
        other = pair.up if sock is pair.down else pair.down
        now = time.monotonic()
        if self.faults is None and not pair.bufs[sock]:
            pair.queues[other].append((now, data))
            return
        buf = pair.bufs[sock] + data
        while True:
            n = _packet_size(buf)
            if n is None or n > len(buf):
                break
            self._packet(pair, sock, other, buf[:n], now)
            buf = buf[n:]
        pair.bufs[sock] = buf

    def _packet(self, pair, sock, other, pkt, now):
        """One whole MQTT packet from ``sock`` to ``other``: faulted if a device PUBLISH (``lossy``)."""
        f = self.faults
        pub = _publish(pkt) if f is not None else None
        if pub is None:
            pair.queues[other].append((now, pkt))
            return
        qos, pid = pub
        r = self.rng.random()
        if r < f[0]:
            self.stats["lost"] += 1
            if qos == 1:        # acknowledged all the same: lost after the sender's hop
                pair.queues[sock].append((now, bytes((0x40, 2, pid >> 8, pid & 0xFF))))
            return
        if r < f[0] + f[2]:
            self.stats["reordered"] += 1
            pair.held[other].append((now + self.rng.uniform(0.0, f[3]), pkt))
        else:
            pair.queues[other].append((now, pkt))
        if self.rng.random() < f[1]:
            self.stats["duplicated"] += 1
            pair.held[other].append((now + self.rng.uniform(0.0, 0.05), pkt))

    def _flush(self, now):
        for sock, pair in list(self.pairs.items()):
            held = pair.held.get(sock)
            if held:        # reordered and duplicated packets, due: to the end of the queue
                due = [h for h in held if h[0] <= now]
                held[:] = [h for h in held if h[0] > now]
                for _, data in sorted(due, key=lambda h: h[0]):
                    pair.queues[sock].append((-math.inf, data))
            q = pair.queues.get(sock)
            while q and q[0][0] + self.hold <= now:
                _, data = q.popleft()
                if self.mode == "cut":
                    self.stats["dropped"] += len(data)
                    continue
                try:
                    sent = sock.send(data)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    self._drop(sock)
                    break
                self.stats["forwarded"] += sent
                if sent < len(data):        # the socket buffer is full: the rest goes first next time
                    q.appendleft((-math.inf, data[sent:]))
                    break

    def _next_release(self, now):
        soonest = None
        for pair in set(self.pairs.values()):
            for q in pair.queues.values():
                if q and (soonest is None or q[0][0] + self.hold < soonest):
                    soonest = q[0][0] + self.hold
            for held in pair.held.values():
                for at, _ in held:
                    if soonest is None or at < soonest:
                        soonest = at
        return 0.5 if soonest is None else max(0.0, min(0.5, soonest - now))

    def _drop(self, sock):
        pair = self.pairs.get(sock)
        if pair is None:
            return
        for s in (pair.down, pair.up):
            self.pairs.pop(s, None)
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    # -- figures ---------------------------------------------------------------------------
    def cut_seconds(self, end=None):
        """Total time spent cut (up to ``end``, default now)."""
        end = time.time() if end is None else end
        return sum((b if b is not None else end) - a for a, b in self.cut_log)


def _packet_size(buf):
    """The size of the MQTT packet at the start of ``buf`` (None: its header is not all there yet)."""
    n, mult = 0, 1
    for i in range(1, min(len(buf), 5)):
        n += (buf[i] & 0x7F) * mult
        if not buf[i] & 0x80:
            return i + 1 + n
        mult *= 128
    return None


def _publish(pkt):
    """(QoS, packet id) of a PUBLISH on a device's ``up`` or ``ctl`` topic, else None."""
    if pkt[0] >> 4 != 3:
        return None
    i = 1
    while pkt[i] & 0x80:
        i += 1
    i += 1
    n = pkt[i] << 8 | pkt[i + 1]
    topic = pkt[i + 2:i + 2 + n]
    if b"/d/" not in topic or not (topic.endswith(b"/up") or topic.endswith(b"/ctl")):
        return None
    qos = (pkt[0] >> 1) & 3
    pid = pkt[i + 2 + n] << 8 | pkt[i + 3 + n] if qos else 0
    return qos, pid
