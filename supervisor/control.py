"""The control socket: a Unix stream socket, owner-only, one JSON request and one JSON reply per connection."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Final

import orjson

_MAX_REQUEST: Final = 64 * 1024


class ControlError(Exception):
    """No daemon answered on the control socket."""


class ControlServer:
    """Listening socket plus the connections being read; driven by the daemon's selector."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(
            0o177
        )  # the socket file is created 0600: no window where others could connect
        try:
            self.sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.buffers: dict[socket.socket, bytes] = {}

    def accept(self) -> socket.socket | None:
        """Accept one waiting connection (non-blocking)."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        conn.setblocking(False)
        self.buffers[conn] = b""
        return conn

    def read_request(self, conn: socket.socket) -> dict[str, Any] | None:
        """Read what is there; a complete request (one line) is returned, else None (keep waiting)."""
        try:
            data = conn.recv(_MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data = b""
        if not data:
            self.drop(conn)
            return None
        buf = self.buffers.get(conn, b"") + data
        if b"\n" not in buf and len(buf) < _MAX_REQUEST:
            self.buffers[conn] = buf
            return None
        try:
            obj = orjson.loads(buf.split(b"\n", 1)[0])
        except orjson.JSONDecodeError:
            obj = None
        return obj if isinstance(obj, dict) else {"cmd": "invalid"}

    def reply(self, conn: socket.socket, obj: dict[str, Any]) -> None:
        """Send the reply and close (small replies fit the socket buffer; bounded wait otherwise)."""
        try:
            conn.settimeout(1.0)
            conn.sendall(orjson.dumps(obj, default=str) + b"\n")
        except OSError:
            pass
        self.drop(conn)

    def drop(self, conn: socket.socket) -> None:
        """Forget and close one connection."""
        self.buffers.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close everything and remove the socket file."""
        for conn in list(self.buffers):
            self.drop(conn)
        self.sock.close()
        self.path.unlink(missing_ok=True)


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
