"""The fault proxy (backend/live/netfault.py) against an echo server: pass, cut, heal, delay and reset."""
import socket
import threading
import time

import pytest

from backend.live.netfault import Proxy


@pytest.fixture
def echo():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve(conn):
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()
    stop.set()
    srv.close()


def _roundtrip(sock, data, timeout=1.0):
    sock.sendall(data)
    sock.settimeout(timeout)
    got = b""
    try:
        while len(got) < len(data):
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        pass
    return got


def test_pass_cut_heal_delay_reset(echo):
    p = Proxy(echo)
    try:
        c = socket.create_connection((p.host, p.port))
        assert _roundtrip(c, b"hello") == b"hello"
        p.cut()
        assert _roundtrip(c, b"lost", timeout=0.3) == b""        # dropped, connection still open
        p.heal()
        assert _roundtrip(c, b"again") == b"again"                # nothing from the cut leaks afterwards
        assert p.stats["dropped"] >= 4 and 0.25 < p.cut_seconds() < 5
        p.delay(0.3)
        t = time.monotonic()
        assert _roundtrip(c, b"slow", timeout=2.0) == b"slow"
        assert time.monotonic() - t >= 0.6                         # held both ways
        p.delay(0)
        p.reset()
        c.settimeout(2.0)
        assert c.recv(10) == b""                                   # the proxy closed the connection
        c2 = socket.create_connection((p.host, p.port))
        assert _roundtrip(c2, b"new") == b"new"
        assert p.stats["connections"] == 2 and p.stats["resets"] == 1
    finally:
        p.close()


def test_large_transfer_survives_a_full_socket_buffer(echo):
    p = Proxy(echo)
    try:
        c = socket.create_connection((p.host, p.port))
        data = bytes(range(256)) * 8192          # 2 MiB both ways
        got = bytearray()
        sender = threading.Thread(target=c.sendall, args=(data,))
        sender.start()
        c.settimeout(5.0)
        while len(got) < len(data):
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
        sender.join()
        assert bytes(got) == data
    finally:
        p.close()


def test_a_shorter_delay_releases_what_is_held(echo):
    p = Proxy(echo)
    try:
        c = socket.create_connection((p.host, p.port))
        p.delay(60)
        assert _roundtrip(c, b"held", timeout=0.5) == b""         # held, not dropped
        t = time.monotonic()
        p.delay(0)
        c.settimeout(2.0)
        assert c.recv(10) == b"held" and time.monotonic() - t < 1.5
    finally:
        p.close()
