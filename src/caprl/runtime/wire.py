"""The wire protocol of caprl's socket services (:mod:`caprl.runtime.socket_service`) and its client side.

One request per connection. Each message, both ways, is an 8-byte big-endian length followed by
that many bytes of UTF-8 JSON. ``{"ping": true}`` is answered ``{"ok": true, "pid": int}``,
``{"shutdown": true}`` ``{"ok": true}`` before the server exits; the service's handler answers the
rest. Failures are answered ``{"error": message}``.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

from caprl.errors import CaprlError

HEADER = struct.Struct(">Q")
MAX_MESSAGE = 256 * 1024 * 1024  # a sanity bound on a request's size, not a real limit


class ServiceError(CaprlError):
    """A server failed to answer a request (the message says which server and how)."""


class ServiceUnavailable(ServiceError):
    """No server answers at the socket (missing, stale, refused or timed out)."""


# -- framing ---------------------------------------------------------------------------------
def frame(message: Mapping[str, Any]) -> bytes:
    """One message as it goes over the socket: its length, then its JSON."""
    data = json.dumps(message).encode("utf-8")
    return HEADER.pack(len(data)) + data


def send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(frame(message))


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> Any:
    """One message; EOFError if the peer closed without sending anything (a liveness probe)."""
    first = sock.recv(HEADER.size)
    if not first:
        raise EOFError("connection closed before any request")
    return recv_rest(sock, first)


def recv_rest(sock: socket.socket, first: bytes) -> Any:
    """The message whose first bytes (at most the header) were already read."""
    (size,) = HEADER.unpack(first + recv_exact(sock, HEADER.size - len(first)))
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is larger than the {MAX_MESSAGE}-byte limit")
    return json.loads(recv_exact(sock, size).decode("utf-8"))


# -- client ----------------------------------------------------------------------------------
def request(socket_path: str, message: Mapping[str, Any], connect_timeout: float, request_timeout: float,
            what: str = "server") -> dict[str, Any]:
    """Send one request, return the answer: ServiceUnavailable if nothing answers at the socket,
    ServiceError for a failed exchange or an ``error`` answer (its text)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(connect_timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:  # FileNotFoundError, ConnectionRefusedError (stale), timeout
            raise ServiceUnavailable(f"no {what} at {socket_path}: {exc}") from None
        sock.settimeout(request_timeout)
        try:
            send(sock, message)
            answer = recv(sock)
        except (OSError, ValueError, EOFError) as exc:
            raise ServiceError(f"the {what} at {socket_path} failed: {exc!r}") from None
    finally:
        sock.close()
    if not isinstance(answer, dict):
        raise ServiceError(f"the {what} answered {type(answer).__name__}, not an object")
    if "error" in answer:
        raise ServiceError(f"the {what} could not answer: {answer['error']}")
    return answer


def ping(socket_path: str, what: str = "server", timeout: float = 5.0) -> int:
    """The server's pid (ServiceUnavailable if none answers)."""
    return int(request(socket_path, {"ping": True}, min(timeout, 1.0), timeout, what)["pid"])
