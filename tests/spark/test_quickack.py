"""backend.spark.quickack: state calls still send the same bytes, and the worker's end acknowledges at once."""
import socket

import pytest

from backend.spark import quickack

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")


class Client:
    """The two attributes of PySpark's StatefulProcessorApiClient that ``install`` uses."""

    def __init__(self, sock):
        self._client_socket = sock
        self.sent = []

    def _send_proto_message(self, message):
        self.sent.append(message)
        self._client_socket.sendall(message)


class Handle:
    def __init__(self, client):
        self._statefulProcessorApiClient = client


def test_requests_are_sent_unchanged_and_then_acknowledged_quickly():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    sock = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        client = Client(sock)
        handle = Handle(client)
        quickack.install(handle)
        quickack.install(handle)                # idempotent: one wrapper
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        client._send_proto_message(b"\x00\x00\x00\x03abc")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        assert client.sent == [b"\x00\x00\x00\x03abc"]
        assert peer.recv(64) == b"\x00\x00\x00\x03abc"
    finally:
        for s in (sock, peer, server):
            s.close()


def test_a_handle_without_the_client_is_left_alone():
    quickack.install(object())
    handle = Handle(None)
    quickack.install(handle)
    assert handle._statefulProcessorApiClient is None
