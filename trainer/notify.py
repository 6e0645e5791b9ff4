"""The trainer's side of the child protocol: sd_notify datagrams to $NOTIFY_SOCKET (a no-op without it)."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY=1, STEP=n, STATUS=…, EXTEND_TIMEOUT_USEC=…; never raises."""

    def __init__(self) -> None:
        # Under torchrun with several processes per node, local rank 0 speaks for the node.
        speaks = os.environ.get("LOCAL_RANK", "0") == "0"
        path = os.environ.get("NOTIFY_SOCKET", "") if speaks else ""
        self._address = ("\0" + path[1:]) if path.startswith("@") else path
        self._sock: socket.socket | None = None
        if self._address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, message: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto(message.encode(), self._address)
        except OSError:
            pass
