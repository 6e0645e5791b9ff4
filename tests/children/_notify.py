"""A minimal sd_notify client for the test children (what any systemd-aware program does)."""

import os
import socket


def notify(message: str) -> None:
    """Send one datagram to $NOTIFY_SOCKET."""
    path = os.environ["NOTIFY_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(path)
        sock.sendall(message.encode())
