"""The control socket: a Unix stream socket, owner-only, one JSON request and one JSON reply per connection."""

from __future__ import annotations

import contextlib
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

from dflashd.logs.safejson import dumps_any
from dflashd.supervisor.host.home import held_path
from dflashd.supervisor.model.bounds import MAX_SECONDS

_MAX_REQUEST: Final = 64 * 1024
MAX_CLIENTS: Final = 256  # more connections at once are closed, oldest first (see client_cap)
IDLE_TIMEOUT_S: Final = 5.0  # a client that neither completes its request nor reads its reply
ACCEPT_BATCH: Final = 256  # connections accepted per wake-up (the backlog is drained, bounded)


def client_cap() -> int:
    """Connections held at once: ``MAX_CLIENTS``, or a quarter of the descriptor limit if lower,
    so idle clients can never take the descriptors a launch or a record needs."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CLIENTS
    return max(4, min(MAX_CLIENTS, soft // 4))


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
        dir_fd: int | None = None,
    ) -> None:
        self.path = path
        # The home held open: the socket is made, checked and removed in that directory,
        # never in whatever the home's path names later (a link planted by someone else).
        self._dir_fd = dir_fd
        self.handlers = dict(handlers)
        self._monotonic = monotonic
        self._opened: dict[socket.socket, float] = {}
        self.cap = client_cap()
        self.refused = 0  # connections closed unanswered (too many, idle, or no fd left)
        # One descriptor kept in reserve: when accept() fails for want of descriptors (EMFILE),
        # it is given up for a moment to accept and close the connection instead of spinning.
        self._reserve: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._bind()
        self.sock.listen(socket.SOMAXCONN)
        self.sock.setblocking(False)
        self._buffers: dict[socket.socket, bytes] = {}
        self._outgoing: dict[socket.socket, memoryview] = {}  # replies the client has not read yet
        self.answered = 0

    def socket_missing(self) -> bool:
        """True when the socket file was removed (or replaced) under us."""
        try:
            st = self._lstat()
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._bound

    def _lstat(self) -> os.stat_result:
        return os.stat(self._name, dir_fd=self._dir_fd, follow_symlinks=False)

    @property
    def _name(self) -> str:
        return self.path.name if self._dir_fd is not None else str(self.path)

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name, dir_fd=self._dir_fd)

    def rebind(self, selector: selectors.BaseSelector) -> None:
        """Make the socket file again (someone deleted it): ``stop`` must stay possible."""
        try:
            selector.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        self._bind()
        selector.register(self.sock, selectors.EVENT_READ, "control")

    def _bind(self) -> None:
        self._unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # created 0600: no window where others could connect
        try:
            self.sock.bind(held_path(self._dir_fd, self.path.name, self.path))
        finally:
            os.umask(old_umask)
        st = self._lstat()
        self._bound = (st.st_dev, st.st_ino)
        self.sock.listen(socket.SOMAXCONN)
        self.sock.setblocking(False)

    def on_event(self, selector: selectors.BaseSelector, fileobj: Any) -> None:
        """The selector saw ``fileobj`` (registered with data ``"control"``) ready.

        The listening socket: every waiting connection is accepted (up to ``ACCEPT_BATCH``)
        and its request read at once if it is already there.  A connection: more of its
        request, or more of its reply (a client that reads slowly never holds the loop).
        """
        if fileobj is self.sock:
            for _ in range(ACCEPT_BATCH):
                conn = self.accept(selector)
                if conn is None:
                    return
                if not self.on_readable(conn):
                    self._watch(selector, conn)
            return
        if fileobj in self._outgoing:
            selector.unregister(fileobj)
            if not self._send_more(fileobj):
                selector.register(fileobj, selectors.EVENT_WRITE, "control")
            return
        if fileobj not in self._buffers:  # closed earlier in this batch (evicted or timed out)
            return
        selector.unregister(fileobj)
        if not self.on_readable(fileobj):
            self._watch(selector, fileobj)

    def _watch(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        events = selectors.EVENT_WRITE if conn in self._outgoing else selectors.EVENT_READ
        selector.register(conn, events, "control")

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
        if len(self._opened) >= self.cap:
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
        return self._reply(conn, self._dispatch(obj))

    def _dispatch(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            return {"ok": False, "error": "a request is one JSON object on one line"}
        cmd = obj.get("cmd")
        handler = self.handlers.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown command {str(cmd)[:40]!r}"}
        return handler(obj)

    def _reply(self, conn: socket.socket, obj: dict[str, Any]) -> bool:
        """Send what the socket takes now; the rest when the client reads.  True when done."""
        self.answered += 1
        self._buffers.pop(conn, None)
        self._outgoing[conn] = memoryview(dumps_any(obj) + b"\n")
        return self._send_more(conn)

    def _send_more(self, conn: socket.socket) -> bool:
        """Non-blocking: True once the reply is out (or the client gone) and ``conn`` closed."""
        view = self._outgoing[conn]
        try:
            sent = conn.send(view)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.drop(conn)
            return True
        view = view[sent:]
        if view:
            self._outgoing[conn] = view
            return False
        self.drop(conn)
        return True

    def drop(self, conn: socket.socket) -> None:
        """Forget and close one connection."""
        self._buffers.pop(conn, None)
        self._outgoing.pop(conn, None)
        self._opened.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close everything and remove the socket file."""
        for conn in list(self._opened):
            self.drop(conn)
        self.sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        with contextlib.suppress(OSError):
            self._unlink()


def stop_timeout(request: dict[str, Any], default_s: float) -> float | str:
    """The ``timeout_s`` of a stop request, or why it is refused (a finite number of seconds)."""
    timeout = request.get("timeout_s", default_s)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return "timeout_s must be a number of seconds"
    if not math.isfinite(timeout) or not 0 <= timeout <= MAX_SECONDS:
        return f"timeout_s must be between 0 and {MAX_SECONDS:g}"
    return float(timeout)


def expired(request: dict[str, Any], now_wall: float) -> bool:
    """A request whose client gave up (``expires_at``, wall seconds, passed): never acted on.

    A daemon frozen (SIGSTOP) while a ``stop`` waited in its socket's backlog would otherwise
    carry out, on resuming, a stop the client already reported as failed.
    """
    at = request.get("expires_at")
    return isinstance(at, int | float) and not isinstance(at, bool) and now_wall > at


def stop_handler(
    default_s: float,
    request_stop: Callable[[float], None],
    current: Callable[[], Any],
    dump_bound_s: float = 0.0,
) -> Handler:
    """The ``stop`` command: validate ``timeout_s``, then ask the daemon to stop.

    The reply carries the timeout in effect and the bound of the stack dump taken before a
    kill, so the client waits as long as the stop can take.
    """

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if expired(req, time.time()):
            return {"ok": False, "error": "the request expired before the daemon read it"}
        timeout = stop_timeout(req, default_s)
        if isinstance(timeout, str):
            return {"ok": False, "error": timeout}
        request_stop(timeout)
        run = current()
        return {
            "ok": True,
            "run": run.run_no if run is not None else None,
            "timeout_s": timeout,
            "dump_bound_s": dump_bound_s,
        }

    return handle


def _connect(sock: socket.socket, path: Path, deadline: float) -> None:
    """Connect, waiting while the daemon's backlog is full (EAGAIN), up to ``deadline``.

    A Unix socket refuses a connect at once with EAGAIN when its backlog is full, even a
    blocking one: that is a busy daemon, not a missing one.
    """
    pause = 0.001
    while True:
        try:
            sock.connect(str(path))
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)  # the daemon's backlog is full: no event tells when it drains
            pause = min(pause * 2, 0.05)


def request(path: Path, obj: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one request to the daemon and return its reply; ControlError when nobody answers."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout_s)
            _connect(sock, path, deadline)
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
