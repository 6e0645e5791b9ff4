"""The child protocol (docs/design.md, "Child protocol"): systemd's sd_notify wire format on a datagram socket.

:func:`parse_notify` is pure.  :class:`NotifyServer` is the socket dflashd gives the
child as ``NOTIFY_SOCKET``; it reads the sender's pid from the kernel (SCM_CREDENTIALS)
so a message from a previous run's leftover process is not taken as this run's progress.
:class:`SystemdNotifier` is the other direction: dflashd telling systemd about itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from pathlib import Path
from typing import Final

from dflashd.supervisor.host.home import held_path
from dflashd.supervisor.model.bounds import bounded_int
from dflashd.supervisor.model.progress import NotifyMessage

_MAX_DATAGRAM: Final = 4096
_CREDS: Final = struct.Struct("iII")


def parse_notify(data: bytes, sender_pid: int | None = None) -> NotifyMessage:
    """Parse ``KEY=VALUE`` lines; unknown keys and malformed values are ignored, like systemd does."""
    fields: dict[str, str] = {}
    for raw in data.decode("utf-8", "replace").split("\n"):
        key, sep, value = raw.partition("=")
        if sep:
            fields[key.strip()] = value
    # bounded: STEP=1e30 or a 40-digit number is no step (bounds.py), never a crash later
    step = bounded_int(fields["STEP"]) if "STEP" in fields else None
    extend = bounded_int(fields.get("EXTEND_TIMEOUT_USEC", ""))
    if extend is not None and extend < 0:
        extend = None
    return NotifyMessage(
        ready=fields.get("READY") == "1",
        stopping=fields.get("STOPPING") == "1",
        watchdog=fields.get("WATCHDOG") == "1",
        step=step,
        status=fields.get("STATUS"),
        extend_timeout_us=extend,
        sender_pid=sender_pid,
    )


class NotifyServer:
    """A non-blocking datagram socket bound at ``path``; the daemon's selector watches ``fileno()``."""

    def __init__(self, path: Path, dir_fd: int | None = None) -> None:
        self.path = path
        # the home held open: made and removed there, never through a link planted later
        self._dir_fd = dir_fd
        self._name = path.name if dir_fd is not None else str(path)
        self._unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        except OSError:
            pass  # no sender pids on this kernel: every datagram is taken as the child's
        old_umask = os.umask(0o177)  # made 0600: no moment where others could send
        try:
            self.sock.bind(held_path(dir_fd, path.name, path))
        finally:
            os.umask(old_umask)
        self.sock.setblocking(False)

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name, dir_fd=self._dir_fd)

    def fileno(self) -> int:
        """For the selector."""
        return self.sock.fileno()

    def receive(self) -> list[NotifyMessage]:
        """Every datagram waiting now."""
        out: list[NotifyMessage] = []
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(
                    _MAX_DATAGRAM, socket.CMSG_SPACE(_CREDS.size)
                )
            except (BlockingIOError, InterruptedError):
                return out
            pid: int | None = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _CREDS.unpack(payload[: _CREDS.size])[0]
            out.append(parse_notify(data, pid))

    def close(self) -> None:
        """Close and remove the socket file."""
        self.sock.close()
        with contextlib.suppress(OSError):
            self._unlink()


def send_notify(socket_path: str, message: str, wait_s: float = 0.0) -> bool:
    """Send one sd_notify datagram (abstract ``@`` addresses included); False when it cannot
    be sent.  Never blocks the daemon's loop on a receiver that does not read: a full queue
    drops the datagram at once, or after ``wait_s`` (a Unix datagram queue holds as few as 10
    messages, ``net.unix.max_dgram_qlen``, and a stuck receiver would freeze the loop)."""
    if not socket_path:
        return False
    address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            if wait_s > 0:
                sock.settimeout(wait_s)
            else:
                sock.setblocking(False)
            sock.connect(address)
            sock.send(message.encode())
    except OSError:  # no receiver, a full queue (BlockingIOError), or the wait ran out
        return False
    return True


# READY=1 and STOPPING=1 tell systemd a state it waits for: worth a short wait for room in a
# full queue; WATCHDOG=1 and STATUS= come again soon and are dropped rather than waited for.
_WORTH_WAITING_FOR: Final = ("READY=1", "STOPPING=1")
NOTIFY_WAIT_S: Final = 0.5


class SystemdNotifier:
    """dflashd's own link to systemd (Type=notify); a no-op when NOTIFY_SOCKET was not set."""

    def __init__(self, socket_path: str | None, watchdog_usec: int | None) -> None:
        self.socket_path = socket_path or ""
        self.watchdog_interval_s = watchdog_usec / 2e6 if watchdog_usec else None

    @classmethod
    def from_environ(cls, environ: dict[str, str]) -> SystemdNotifier:
        """Take NOTIFY_SOCKET / WATCHDOG_USEC meant for us (WATCHDOG_PID must be ours if set)."""
        watchdog: int | None = None
        pid = environ.get("WATCHDOG_PID")
        if environ.get("WATCHDOG_USEC", "").isdigit() and (pid is None or pid == str(os.getpid())):
            watchdog = int(environ["WATCHDOG_USEC"])
        return cls(environ.get("NOTIFY_SOCKET"), watchdog)

    @property
    def enabled(self) -> bool:
        """True under systemd with Type=notify."""
        return bool(self.socket_path)

    def notify(self, message: str) -> bool:
        """Send ``message`` if enabled (never blocking for long: :func:`send_notify`)."""
        if not self.enabled:
            return False
        wait = NOTIFY_WAIT_S if message.startswith(_WORTH_WAITING_FOR) else 0.0
        return send_notify(self.socket_path, message, wait)
