"""The torch side of sharing a node's hang finding through the job's rendezvous store.

``torchrun --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` runs a c10d ``TCPStore`` at the
endpoint; every node of the job reaches it already.  dflashd's daemon never imports torch: it
runs this file as a script under the job's own Python (a worker's interpreter, which has torch;
``supervisor/host/rdzvstore.py``), which writes this node's finding under
``<key space>/node/<group rank>`` and prints every node's back as one JSON line.  As a script
it must not import dflashd (the job's environment may not have it): the standard library and
``torch.distributed.TCPStore`` only, and torch only inside :func:`_helper`.

    python storepeer.py '{"endpoint": "10.0.0.1:29400", "key_space": ..., ...}'
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

STORE_TIMEOUT_S = 10.0
C10D_DEFAULT_PORT = 29400  # torchrun's c10d rendezvous port when the endpoint names none
MAX_NODES = 4096  # the most keys read (a request naming more is cut)
MAX_VALUE_BYTES = 16384  # a node's report is a few hundred bytes; a larger value is not ours


def store_address(endpoint: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``, or a bare host: c10d's default port), else None."""
    endpoint = endpoint.strip()
    if not endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    if not host or "]" in port or (host.count(":") and not host.startswith("[")):
        host, port = endpoint, str(C10D_DEFAULT_PORT)
    host = host.strip("[]")
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        return None
    return host, int(port)


def _deadline(seconds: float) -> None:
    """One bound for the whole helper: a frozen store host accepts the connection and then
    answers nothing, and each store call would wait its own timeout in turn (30 s and more)."""
    import os
    import threading

    def overrun() -> None:
        print(json.dumps({"error": f"the store did not answer within {seconds:.0f}s"}), flush=True)
        os._exit(0)

    timer = threading.Timer(seconds, overrun)
    timer.daemon = True
    timer.start()
    _TIMERS.append(timer)


_TIMERS: list[Any] = []  # the deadline, cancelled once the answer is ready


def _helper(request: dict[str, Any]) -> dict[str, Any]:
    """In the job's Python: one write and one read of the store."""
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    _deadline(STORE_TIMEOUT_S + 2.0)  # the store's calls together; torch's import before it
    address = store_address(str(request["endpoint"]))
    if address is None:
        return {"error": f"no store address in {request['endpoint']!r}"}
    store = TCPStore(
        address[0],
        address[1],
        is_master=False,
        timeout=timedelta(seconds=STORE_TIMEOUT_S),
        wait_for_workers=False,
    )
    space, nodes = str(request["key_space"]), min(int(request["nodes"]), MAX_NODES)
    now = time.time()
    if request.get("state"):
        mine = {k: request.get(k) for k in ("node", "state", "waited_s", "why", "world")}
        store.set(f"{space}/node/{int(request['node'])}", json.dumps({**mine, "at": now}))
    reports, skipped = [], 0
    for node in range(nodes):
        key = f"{space}/node/{node}"
        if not store.check([key]):
            continue
        found = _report(store.get(key), now)  # one bad value never hides the others
        if found is None:
            skipped += 1
        else:
            reports.append(found)
    return {"reports": reports, "skipped": skipped}


def _report(raw: bytes, now: float) -> dict[str, Any] | None:
    """One node's value as written by this helper, else None (another writer's, a value too
    large, not JSON, not an object).  ``age_s`` is by this host's clock and may be negative
    (a writer's clock ahead of ours): the daemon judges it (model/world.py)."""
    if len(raw) > MAX_VALUE_BYTES:
        return None
    try:
        found = json.loads(raw)
        at = float(found.pop("at"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not isinstance(found, dict) or not math.isfinite(at):
        return None
    found["age_s"] = now - at
    return found


if __name__ == "__main__":
    try:
        result = _helper(json.loads(sys.argv[1]))
    except Exception as exc:  # the daemon gets one line, whatever went wrong
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    for timer in _TIMERS:
        timer.cancel()  # a race left: an overrun printing at this instant makes two lines,
        # which the daemon reads as an error (never as a wrong answer)
    print(json.dumps(result))
