"""The control socket: a Unix stream socket, owner-only, one JSON request and one JSON reply per connection."""

from __future__ import annotations

import errno
import math
import os
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from dflashd.supervisor.config import MAX_SECONDS

_MAX_REQUEST: Final = 64 * 1024
MAX_CLIENTS: Final = 32  # more connections at once are closed, oldest first
IDLE_TIMEOUT_S: Final = 5.0  # a client that sends no complete request in time is closed


class ControlError(Exception):
    """No daemon answered on the control socket."""


Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlServer:
    """Listening socket plus the connections being read; driven by the daemon's selector.

    Requests are dispatched through ``handlers``, a ``{command: handler}`` table (as
    Supervisor's rpcinterface): the daemon registers what it answers, the server owns the
    sockets and their buffers.
    """

    def __init__(
        self,
        path: Path,
        handlers: Mapping[str, Handler],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.handlers = dict(handlers)
        self._monotonic = monotonic
        self._opened: dict[socket.socket, float] = {}
        self.refused = 0  # connections closed unanswered (too many, idle, or no fd left)
        # One descriptor kept in reserve: when accept() fails for want of descriptors (EMFILE),
        # it is given up for a moment to accept and close the connection instead of spinning.
        self._reserve: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # created 0600: no window where others could connect
        try:
            self.sock.bind(str(path))
        finally:
            os.umask(old_umask)
        self.sock.listen(16)
        self.sock.setblocking(False)
        self._buffers: dict[socket.socket, bytes] = {}

    def on_event(self, selector: selectors.BaseSelector, fileobj: Any) -> None:
        """The selector saw ``fileobj`` (registered with data ``"control"``) readable."""
        if fileobj is self.sock:
            conn = self.accept(selector)
            if conn is not None:
                selector.register(conn, selectors.EVENT_READ, "control")
            return
        if fileobj not in self._buffers:  # closed earlier in this batch (evicted or timed out)
            return
        selector.unregister(fileobj)
        if not self.on_readable(fileobj):
            selector.register(fileobj, selectors.EVENT_READ, "control")

    def accept(self, selector: selectors.BaseSelector | None = None) -> socket.socket | None:
        """Accept one waiting connection (non-blocking); never raises."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed_with_reserve()
            return None
        conn.setblocking(False)
        if len(self._buffers) >= MAX_CLIENTS:
            oldest = min(self._opened, key=self._opened.__getitem__)
            self._forget(oldest, selector)
        self._buffers[conn] = b""
        self._opened[conn] = self._monotonic()
        return conn

    def _shed_with_reserve(self) -> None:
        """Out of descriptors: free the reserve, accept the waiting client and close it at once."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        try:
            conn, _ = self.sock.accept()
            conn.close()
            self.refused += 1
        except OSError:
            pass
        try:
            self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._reserve = None

    def next_expiry(self) -> float | None:
        """When the oldest open connection times out (monotonic), if any is open."""
        return min(self._opened.values()) + IDLE_TIMEOUT_S if self._opened else None

    def expire(self, selector: selectors.BaseSelector) -> None:
        """Close connections idle past the timeout."""
        now = self._monotonic()
        for conn, opened in list(self._opened.items()):
            if now - opened >= IDLE_TIMEOUT_S:
                self._forget(conn, selector)

    def _forget(self, conn: socket.socket, selector: selectors.BaseSelector | None) -> None:
        """Close a connection unanswered, and take it off the selector first."""
        if selector is not None:
            try:
                selector.unregister(conn)
            except (KeyError, ValueError):
                pass
        self.drop(conn)
        self.refused += 1

    def on_readable(self, conn: socket.socket) -> bool:
        """Read what is there; answer a complete request.  True when ``conn`` is finished (closed)."""
        try:
            data = conn.recv(_MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self.drop(conn)
            return True
        buf = self._buffers.get(conn, b"") + data
        if b"\n" not in buf and len(buf) < _MAX_REQUEST:
            self._buffers[conn] = buf
            return False
        try:
            obj = orjson.loads(buf.split(b"\n", 1)[0])
        except orjson.JSONDecodeError:
            obj = None
        self._reply(conn, self._dispatch(obj))
        return True

    def _dispatch(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            return {"ok": False, "error": "a request is one JSON object on one line"}
        cmd = obj.get("cmd")
        handler = self.handlers.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown command {str(cmd)[:40]!r}"}
        return handler(obj)

    def _reply(self, conn: socket.socket, obj: dict[str, Any]) -> None:
        """Send the reply and close (small replies fit the socket buffer; bounded wait otherwise)."""
        try:
            conn.settimeout(1.0)
            conn.sendall(orjson.dumps(obj, default=str) + b"\n")
        except OSError:
            pass
        self.drop(conn)

    def drop(self, conn: socket.socket) -> None:
        """Forget and close one connection."""
        self._buffers.pop(conn, None)
        self._opened.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close everything and remove the socket file."""
        for conn in list(self._buffers):
            self.drop(conn)
        self.sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        self.path.unlink(missing_ok=True)


def stop_timeout(request: dict[str, Any], default_s: float) -> float | str:
    """The ``timeout_s`` of a stop request, or why it is refused (a finite number of seconds)."""
    timeout = request.get("timeout_s", default_s)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return "timeout_s must be a number of seconds"
    if not math.isfinite(timeout) or not 0 <= timeout <= MAX_SECONDS:
        return f"timeout_s must be between 0 and {MAX_SECONDS:g}"
    return float(timeout)


def stop_handler(
    default_s: float, request_stop: Callable[[float], None], current: Callable[[], Any]
) -> Handler:
    """The ``stop`` command: validate ``timeout_s``, then ask the daemon to stop."""

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        timeout = stop_timeout(req, default_s)
        if isinstance(timeout, str):
            return {"ok": False, "error": timeout}
        request_stop(timeout)
        run = current()
        return {"ok": True, "run": run.run_no if run is not None else None}

    return handle


def request(path: Path, obj: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one request to the daemon and return its reply; ControlError when nobody answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(orjson.dumps(obj) + b"\n")
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ControlError(f"no daemon listening on {path}") from exc
    except OSError as exc:
        raise ControlError(f"control socket {path}: {exc}") from exc
    try:
        reply = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise ControlError("daemon sent an unreadable reply") from exc
    if not isinstance(reply, dict):
        raise ControlError("daemon sent an unreadable reply")
    return reply
