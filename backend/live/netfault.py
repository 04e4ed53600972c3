"""A loopback TCP proxy that cuts, delays and resets traffic, for live fault tests (DESIGN.md §5 hostile network).

Devices connect to the proxy instead of the broker; the proxy forwards every byte both ways until told
otherwise. ``cut()`` drops traffic in both directions while keeping the connections open (what a
failed Wi-Fi link or a partition looks like to TCP: silence, then a keepalive timeout), ``heal()``
forwards again, ``delay(s)`` holds every chunk for ``s`` seconds (chunks already held included, so
``delay(0)`` releases them at once), ``reset()`` closes every connection
(a broker or NAT restart). The agents keep sampling and logging their ground truth meanwhile, so a
stale window is visible to the checker, unlike a SIGSTOP. It listens on 127.0.0.1 only.
"""
import collections
import math
import selectors
import socket
import threading
import time

_CHUNK = 65536


class _Pair:
    __slots__ = ("down", "up", "queues")

    def __init__(self, down, up):
        self.down = down            # the device side
        self.up = up                # the broker side
        self.queues = {down: collections.deque(), up: collections.deque()}   # socket -> [(received, data)] to send


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
        self.stats = {"connections": 0, "forwarded": 0, "dropped": 0, "resets": 0, "cuts": 0}
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
        pair.queues[other].append((time.monotonic(), data))

    def _flush(self, now):
        for sock, pair in list(self.pairs.items()):
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
