"""A small HTTP server for /metrics that no client can exhaust (one thread, bounded everything).

prometheus-client's own server spends a thread and a descriptor on every connection, with no
timeout, so idle connections could use up the daemon's descriptors.  Here one thread drives
every connection through a selector, with:

- at most ``MAX_CONNECTIONS`` open at once (the oldest is closed to make room);
- ``DEADLINE_S`` for a connection to send its request and take its whole answer;
- ``MAX_REQUEST_BYTES`` of request head; one request per connection (``Connection: close``).

Anything that goes wrong with one connection closes that connection, never the server.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

MAX_CONNECTIONS: Final = 16
DEADLINE_S: Final = 5.0
MAX_REQUEST_BYTES: Final = 8 * 1024


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    inbox: bytes = b""
    outbox: memoryview | None = None
    extra: dict[str, object] = field(default_factory=dict)


Page = Callable[[], tuple[bytes, str, int]]  # the body, its content type and the status code


class BoundedHttpServer:
    """Serve ``pages`` (path -> body maker) on ``host:port`` from one daemon thread."""

    def __init__(self, host: str, port: int, pages: dict[str, Page]) -> None:
        self.pages = pages
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(64)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[socket.socket, _Conn] = {}
        self._stopping = threading.Event()
        self.served = 0
        self.closed_early = 0
        self._thread = threading.Thread(target=self._serve, name="dflashd-metrics", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            timeout = self._next_deadline()
            try:
                events = self._selector.select(timeout)
            except OSError:
                continue
            for key, mask in events:
                try:
                    self._on(key, mask)
                except Exception:  # one connection's trouble never ends the server
                    if isinstance(key.fileobj, socket.socket) and key.fileobj is not self.sock:
                        self._close(key.fileobj, early=True)
            self._expire()
        for conn in list(self._conns):
            self._close(conn, early=False)

    def _next_deadline(self) -> float | None:
        if not self._conns:
            return None
        first = min(c.opened for c in self._conns.values()) + DEADLINE_S
        return max(0.0, first - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for sock, conn in list(self._conns.items()):
            if now - conn.opened >= DEADLINE_S:
                self._close(sock, early=True)

    def _on(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == "wake":
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)
            return
        if key.fileobj is self.sock:
            self._accept()
            return
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        conn = self._conns.get(sock)
        if conn is None:
            return
        if mask & selectors.EVENT_WRITE:
            self._send(conn)
        else:
            self._receive(conn)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    return  # no descriptor now: the client waits in the backlog
                return
            sock.setblocking(False)
            if len(self._conns) >= MAX_CONNECTIONS:
                oldest = min(self._conns.values(), key=lambda c: c.opened)
                self._close(oldest.sock, early=True)
            self._conns[sock] = _Conn(sock, time.monotonic())
            self._selector.register(sock, selectors.EVENT_READ, "conn")

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._close(conn.sock, early=True)
            return
        conn.inbox += data
        head_end = conn.inbox.find(b"\r\n\r\n")
        if head_end < 0:
            if len(conn.inbox) > MAX_REQUEST_BYTES:
                self._answer(conn, 431, b"request head too large\n", "text/plain")
            return
        self._answer_request(conn, conn.inbox[:head_end])

    def _answer_request(self, conn: _Conn, head: bytes) -> None:
        line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace").split()
        if len(line) != 3 or not line[2].startswith("HTTP/"):
            self._answer(conn, 400, b"bad request\n", "text/plain")
            return
        method, target = line[0], line[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._answer(conn, 405, b"GET or HEAD\n", "text/plain")
            return
        page = self.pages.get(target)
        if page is None:
            self._answer(conn, 404, b"not found: try /metrics\n", "text/plain")
            return
        try:
            body, content_type, code = page()
        except Exception as exc:
            self._answer(conn, 500, f"{type(exc).__name__}\n".encode(), "text/plain")
            return
        self._answer(conn, code, body, content_type, head_only=method == "HEAD")

    def _answer(
        self, conn: _Conn, code: int, body: bytes, content_type: str, *, head_only: bool = False
    ) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
        reason[503] = "Service Unavailable"
        head = (
            f"HTTP/1.1 {code} {reason.get(code, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        conn.outbox = memoryview(head if head_only else head + body)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, "conn")
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        if conn.outbox is None:
            return
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn.sock, early=True)
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self.served += 1
            self._close(conn.sock, early=False)

    def _close(self, sock: socket.socket, *, early: bool) -> None:
        if self._conns.pop(sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()
        if early:
            self.closed_early += 1

    def stop(self) -> None:
        """Stop serving and close every socket (bounded)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")
        self._thread.join(2.0)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.sock)
        self.sock.close()
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
