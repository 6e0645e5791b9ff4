"""Issue 41 (e): a restart that torchrun handles itself is booked by the ledger.

``dflashd start -- torchrun --max-restarts 1 …`` around a worker that SIGKILLs itself once at
step 38 (its last save at step 20): torchrun starts it again, it resumes from step 20 and
completes.  dflashd relaunches nothing, and the run's exit record books the failure -> the
first step after it as downtime and steps 21..38, done twice, as redone — not as productive.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord
from dflashd.logs.records import parse_timestamp
from tests.helpers import run_cli, write_config
from tests.multinode.two_nodes import Node, torchrun

pytestmark = pytest.mark.trainer  # torchrun

CHILD = Path(__file__).parent.parent / "children" / "restart_once.py"


def test_torchrun_restarting_its_worker_is_downtime_and_the_steps_again_are_redone(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    state = tmp_path / "saved-step"
    command = [
        *torchrun(),
        "--standalone",
        "--nproc-per-node=1",
        "--max-restarts=1",
        "--monitor-interval=0.5",
        str(CHILD),
        str(state),
        "38",
        "60",
        "20",
    ]
    top = {"command": command, "gpus": "none", "start_wait_s": 0.0}
    node = Node("one", tmp_path / "home", write_config(tmp_path / "c.toml", top))
    try:
        node.start()
        ended = node.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "exit", 180)
    finally:
        run_cli("stop", "--home", str(node.home), "--timeout", "5")
    assert isinstance(ended, EventRecord)
    assert ended.fields["verdict"] == "completed", ended.fields
    assert ended.run == 1, "torchrun restarted the worker; dflashd relaunched nothing"
    records = node.records()
    failed = next(r for r in records if isinstance(r, EventRecord) and r.event == "worker_failed")
    after = [
        r
        for r in records
        if isinstance(r, LineRecord)
        and r.line.startswith("step ")
        and parse_timestamp(r.ts) > parse_timestamp(failed.ts)
    ]
    recovery_s = parse_timestamp(after[0].ts) - parse_timestamp(failed.ts)
    assert after[0].line.startswith("step 21 "), after[0].line
    again = next(r for r in after if r.line.startswith("step 39 "))
    redone_s = parse_timestamp(again.ts) - parse_timestamp(after[0].ts)
    cost = ended.fields["cost"]
    print({"cost": cost, "recovery_s": round(recovery_s, 2), "redone_s": round(redone_s, 2)})
    # the buckets match the log's own timestamps (a record's time is when it was written)
    assert cost["downtime_s"] == pytest.approx(recovery_s, abs=0.6)
    assert cost["redone_s"] == pytest.approx(redone_s, abs=0.6)
    assert cost["redone_s"] >= 1.0  # 18 steps of 0.1 s, done twice
    assert cost.get("detection_s", 0.0) < 2.0  # the worker's kill -> torchrun saw it
