"""Share a node's hang finding through the job's own rendezvous store (issue 41).

``torchrun --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` runs a c10d ``TCPStore`` at the
endpoint for the rendezvous; every node of the job reaches it already.  dflashd writes its
finding there under a key space of its own (``dflashd/<rdzv id>/node/<group rank>``) and
reads the other nodes' findings back: no protocol of dflashd's, no port of its own.

The daemon never imports torch.  This file is also a script: :func:`share_and_hear` runs it
under the job's own Python (a worker's interpreter, which has torch), on the hang sample's
thread, bounded by a timeout, in a process group of its own that is killed if it overruns.
Run as a script it imports only the standard library and ``torch.distributed.TCPStore``;
it must not import dflashd (the job's environment may not have it).

    python rdzvstore.py '{"endpoint": "10.0.0.1:29400", "key_space": ..., ...}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

HELPER_TIMEOUT_S = 30.0  # importing torch takes seconds; a store that does not answer, 10 s
STORE_TIMEOUT_S = 10.0
C10D_DEFAULT_PORT = 29400  # torchrun's c10d rendezvous port when the endpoint names none


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


def share_and_hear(
    request: dict[str, Any], python: str, job_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the helper under ``python`` (with ``job_env``, the worker's PYTHONPATH and such):
    write this node's finding, read every node's.

    Returns ``{"reports": [...]}`` or ``{"error": "..."}``; never raises, never blocks past
    :data:`HELPER_TIMEOUT_S`.
    """
    argv = [python, os.path.abspath(__file__), json.dumps(request)]
    env = {**os.environ, **(job_env or {}), "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
    except OSError as exc:
        return {"error": f"the store helper did not start: {exc.strerror or exc}"}
    try:
        out, err = proc.communicate(timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # the daemon's side only (a script run never gets here): custody sends every signal
        from dflashd.supervisor.host.custody import end_own_child_session

        end_own_child_session(proc)  # its own session: only what we started
        proc.communicate()
        return {"error": f"the store helper did not answer within {HELPER_TIMEOUT_S:.0f}s"}
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        return {"error": f"the store helper failed: {last[0][:300]}"}
    try:
        answer = json.loads(out.decode())
    except ValueError:
        return {"error": "the store helper's answer was not JSON"}
    return answer if isinstance(answer, dict) else {"error": "the store helper's answer was odd"}


def _helper(request: dict[str, Any]) -> dict[str, Any]:
    """In the job's Python: one write and one read of the store."""
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

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
    space, nodes = str(request["key_space"]), int(request["nodes"])
    now = time.time()
    if request.get("state"):
        mine = {k: request[k] for k in ("node", "state", "waited_s", "why")}
        store.set(f"{space}/node/{int(request['node'])}", json.dumps({**mine, "at": now}))
    reports = []
    for node in range(nodes):
        key = f"{space}/node/{node}"
        if not store.check([key]):
            continue
        found = json.loads(store.get(key))
        found["age_s"] = max(0.0, now - float(found.pop("at", now)))
        reports.append(found)
    return {"reports": reports}


if __name__ == "__main__":
    try:
        result = _helper(json.loads(sys.argv[1]))
    except Exception as exc:  # the daemon gets one line, whatever went wrong
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(result))
