"""Quick TCP acknowledgements on the Python worker's socket to Spark's state server (DESIGN.md §6).

Every state call of ``transformWithStateInPandas`` (registering a state variable, ``exists``, ``get``,
``update``, the handle's state changes: ~16 per batch in the job) is a request to the JVM's state server
and a reply the JVM writes as a 4-byte length and then the body. The JVM's socket keeps Nagle's algorithm,
so the body waits until the worker acknowledges the length, and Linux delays that acknowledgement
(delayed ACK, 40 ms and more): strace of the worker shows each reply's 4 bytes arriving, then its body
4-100 ms later. ``install`` sets ``TCP_QUICKACK`` on the worker's end after each request, so the length is
acknowledged at once and the body follows. It changes no byte exchanged; where the option or PySpark's
client attributes are missing it does nothing.
"""
import socket


def install(handle):
    """Quick acknowledgements for the state calls of ``handle`` (a ``StatefulProcessorHandle``)."""
    client = getattr(handle, "_statefulProcessorApiClient", None)
    sock = getattr(client, "_client_socket", None)
    send = getattr(client, "_send_proto_message", None)
    if sock is None or send is None or not hasattr(socket, "TCP_QUICKACK") or getattr(send, "quickack", False):
        return

    def send_quickly(message):
        send(message)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    send_quickly.quickack = True
    client._send_proto_message = send_quickly
