"""Share a node's hang finding through the job's own rendezvous store (issue 41).

``torchrun --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` runs a c10d ``TCPStore`` at the
endpoint for the rendezvous; every node of the job reaches it already.  dflashd writes its
finding there under a key space of its own (``dflashd/<rdzv id>/node/<group rank>``) and
reads the other nodes' findings back: no protocol of dflashd's, no port of its own.

The daemon never imports torch: :func:`share_and_hear` runs ``trainer/storepeer.py`` (the torch
side, a script) under the job's own Python (a worker's interpreter, which has torch), on the
hang sample's thread, bounded by a timeout, in a session of its own that is ended if it
overruns.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HELPER_TIMEOUT_S = 30.0  # importing torch takes seconds; a store that does not answer, 10 s
# the torch side, run by path (never imported here): dflashd/trainer/storepeer.py
STORE_PEER = Path(__file__).parents[2] / "trainer" / "storepeer.py"


def share_and_hear(
    request: dict[str, Any], python: str, job_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the helper under ``python`` (with ``job_env``, the worker's PYTHONPATH and such):
    write this node's finding, read every node's.

    Returns ``{"reports": [...]}`` or ``{"error": "..."}``; never raises, never blocks past
    :data:`HELPER_TIMEOUT_S`.
    """
    argv = [python, str(STORE_PEER), json.dumps(request)]
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
