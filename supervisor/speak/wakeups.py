"""The daemon's ways in, behind one selector: the wake pipe, notify.sock and control.sock.

Threads and signal handlers reach the loop through the wake pipe (the inbox); the job's
``sd_notify`` datagrams come through notify.sock; clients through control.sock, served
here without blocking (a slow or idle client is expired, never waited on).  A removed
control.sock is bound again, looked at no more than once a second.
"""

from __future__ import annotations

import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.notify import NotifyServer
from dflashd.supervisor.model.progress import NotifyMessage
from dflashd.supervisor.speak.control import ControlServer
from dflashd.supervisor.speak.diagnostics import get_logger

log = get_logger("dflashd")
SOCKET_CHECK_S: Final = 1.0


@dataclass
class Wake:
    """What one wait brought: the wake pipe readable, and the notify datagrams received."""

    woken: bool = False
    said: list[NotifyMessage] = field(default_factory=list)


class Wakeups:
    """The selector over the wake pipe and the two sockets."""

    def __init__(
        self,
        home: Home,
        clock: Clock,
        wake_fd: int,
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]],
        home_fd: int | None = None,
    ) -> None:
        self.home, self.clock = home, clock
        self.selector = selectors.DefaultSelector()
        # both sockets live in the home held open (home_fd), whatever its path names later
        self.control = ControlServer(home.control_socket, handlers, clock.monotonic, home_fd)
        self.notify = NotifyServer(home.notify_socket, home_fd)
        self.selector.register(wake_fd, selectors.EVENT_READ, "wake")
        self.selector.register(self.notify.fileno(), selectors.EVENT_READ, "notify")
        self.selector.register(self.control.sock, selectors.EVENT_READ, "control")
        self._check_at = 0.0

    def wait(self, timeout_s: float | None) -> Wake:
        """Sleep until something wake (or ``timeout_s``); control clients are served here."""
        wake = Wake()
        for key, _ in self.selector.select(timeout_s):
            if key.data == "wake":
                wake.woken = True
            elif key.data == "notify":
                wake.said.extend(self.notify.receive())
            elif key.data == "control":
                self.control.on_event(self.selector, key.fileobj)
        self.control.expire(self.selector)
        self._check_socket()
        return wake

    def next_expiry(self) -> float | None:
        """When the oldest control client times out."""
        return self.control.next_expiry()

    def _check_socket(self) -> None:
        now = self.clock.monotonic()
        if now < self._check_at:
            return
        self._check_at = now + SOCKET_CHECK_S
        if self.control.socket_missing():
            log.warning("control_socket_rebound", path=str(self.home.control_socket))
            self.control.rebind(self.selector)

    def reopen(self) -> None:
        """SIGHUP/SIGUSR1: bind control.sock again if its file was removed."""
        if self.control.socket_missing():
            self.control.rebind(self.selector)

    def close(self) -> None:
        """Close both sockets and the selector."""
        try:
            self.control.close()
            self.notify.close()
        finally:
            self.selector.close()
