"""Issue 41 (a)-(d): a job judged as a whole across nodes, on CPU with gloo.

(c): rank 1 freezes on a lock in its own code while rank 0 waits in ``all_reduce``: node B
holds the culprit and ends it as hung within 60 s; node A's run then fails (its peer is gone)
and says so; both relaunch and complete.

(d): every rank of both nodes waits in ``dist.recv`` from the other for ever: each node alone
sees only a wait on a remote peer, and through the rendezvous store (decide/world.py) both
learn that the whole world waits, so the run is ended after ``remote_wait_s``.

Two dflashd homes stand for two nodes; each supervises ``torchrun --nnodes 2 --nproc-per-node 1``
around one c10d rendezvous on 127.0.0.1.  At step 20 rank 0 (node A) evaluates in a Python
loop with no output while rank 1 (node B) waits in ``dist.barrier()``: node B's only rank sits
in a collective for the whole evaluation, with no CPU and no writes.  It waits on work that
happens elsewhere, so neither node ends anything: both runs complete.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord
from dflashd.logs.records import parse_timestamp
from tests.helpers import run_cli, write_config
from tests.multinode.two_nodes import Node, free_port, torchrun

pytestmark = pytest.mark.trainer  # torch and torchrun

CHILD = Path(__file__).parent.parent / "children" / "eval_then_barrier.py"
EVAL_S = float(os.environ.get("DFLASHD_REMOTE_EVAL_S", "35"))  # two rounds and more


def _node(
    root: Path,
    name: str,
    port: int,
    is_host: bool,
    args: list[str],
    *,
    restarts: int = 0,
    **extra: object,
) -> Node:
    command = [
        *torchrun(),
        f"--max-restarts={restarts}",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=dflashd-remote-wait",
        f"--rdzv-conf=is_host={'true' if is_host else 'false'},read_timeout=60",
        str(CHILD),
        *args,
    ]
    top = {
        "command": command,
        "node": name,
        "gpus": "none",
        "env": {"OMP_NUM_THREADS": "1"},
        "first_step_timeout_s": 600.0,
        "start_wait_s": 0.0,
        **extra,
    }
    restart = {"backoff_initial_s": 1.0, "stop_timeout_s": 10.0}
    # each alert's JSON, one line each, in a file of the node's own
    sink = [
        "sh",
        "-c",
        f"cat >> {root / (name + '-alerts.jsonl')}; echo >> {root / (name + '-alerts.jsonl')}",
    ]
    config = write_config(root / f"{name}.toml", top, restart=restart, alerts={"command": sink})
    return Node(name, root / name, config)


def test_a_rank_waiting_in_a_barrier_for_another_nodes_eval_or_save_is_never_ended(
    tmp_path: Path,
) -> None:
    """(a) rank 0 evaluates in a Python loop, and side by side (b) another job's rank 0 saves
    a 500 MB checkpoint in chunks, while the other node's rank waits in ``dist.barrier()``."""
    pairs = []
    for first, second, mode in (("a", "b", "eval"), ("c", "d", "checkpoint")):
        port = free_port()
        args = ["20", str(EVAL_S), "40", mode, str(tmp_path / f"{mode}.bin")]
        pairs.append(
            [_node(tmp_path, first, port, True, args), _node(tmp_path, second, port, False, args)]
        )
    every = [node for pair in pairs for node in pair]
    try:
        for node in every:
            node.start()
        for node in every:
            node.wait_for(
                lambda r: isinstance(r, EventRecord) and r.event == "first_step", timeout=300
            )
        started = time.monotonic()
        # the evaluation lasts until node B has judged its rank's wait (EVAL_S at least): on a
        # loaded box a round of stacks can take longer than a fixed evaluation would
        pairs[0][1].wait_for(judged_elsewhere, timeout=EVAL_S + 240)
        (tmp_path / "eval.bin.go").touch()
        exits = [
            node.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "exit", EVAL_S + 300)
            for node in every
        ]
        took = time.monotonic() - started
    finally:
        for node in every:
            run_cli("stop", "--home", str(node.home), "--timeout", "5")
    for node, ended in zip(every, exits, strict=True):
        assert isinstance(ended, EventRecord)
        assert ended.fields["verdict"] == "completed", (node.name, ended.fields)
        assert ended.run == 1, "no run was ended and relaunched"
    assert took >= EVAL_S - 5  # the evaluation did happen, and was waited out
    nodes = pairs[0]
    saver = pairs[1][0].events("hang_check")
    assert not saver or all(c.fields.get("finding") != "hung" for c in saver)
    checks = nodes[1].events("hang_check")
    assert any(c.fields.get("finding") == "elsewhere" for c in checks), checks
    assert "barrier" in " ".join(str(c.fields.get("why")) for c in checks)
    assert not nodes[0].events("hang_suspect") or all(
        c.fields.get("finding") == "working" for c in nodes[0].events("hang_check")
    )


def judged_elsewhere(record: object) -> bool:
    """A round of node B's that found its rank waiting on work elsewhere."""
    return (
        isinstance(record, EventRecord)
        and record.event == "hang_check"
        and record.fields.get("finding") == "elsewhere"
    )


REMOTE_WAIT_S = float(os.environ.get("DFLASHD_REMOTE_WAIT_S", "15"))


def test_every_rank_of_every_node_waiting_on_each_other_is_ended_through_the_store(
    tmp_path: Path,
) -> None:
    port = free_port()
    args = ["20", "0", "40", "deadlock"]
    extra = {"remote_wait_s": REMOTE_WAIT_S}
    nodes = [
        _node(tmp_path, "a", port, True, args, **extra),
        _node(tmp_path, "b", port, False, args, **extra),
    ]
    limit = REMOTE_WAIT_S + 60
    if os.environ.get("DFLASHD_DEBUG_STORE"):
        limit = 0.0
    try:
        for node in nodes:
            node.start()
        exits = [
            node.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "exit", limit + 300)
            for node in nodes
        ]
    finally:
        for node in nodes:
            run_cli("stop", "--home", str(node.home), "--timeout", "5")
    ended_by_store = []
    for node, ended in zip(nodes, exits, strict=True):
        assert isinstance(ended, EventRecord)
        found = [c for c in node.events("hang_check") if c.fields.get("finding") == "elsewhere"]
        steps = [
            r for r in node.records() if isinstance(r, LineRecord) and r.line.startswith("step ")
        ]
        # the wait was found ~20 s after the last step (suspicion, then three samples); the
        # run must end within remote_wait_s + 60 s of that
        after = parse_timestamp(ended.ts) - parse_timestamp(found[0].ts)
        since_step = parse_timestamp(ended.ts) - parse_timestamp(steps[-1].ts)
        print(node.name, ended.fields["verdict"], round(after, 1), round(since_step, 1))
        assert after <= limit, (node.name, after)
        evidence = str(ended.fields.get("hang_evidence"))
        if "every node of the world waits" in evidence:
            ended_by_store.append(node.name)
            assert "recv" in evidence, evidence
        else:  # its peer was ended first: its collective failed, and its record says so
            assert ended.fields["verdict"] == "crashed", ended.fields
            assert "recv" in ended.fields["waited_elsewhere"]["why"], ended.fields
        sent = (tmp_path / f"{node.name}-alerts.jsonl").read_text().split("\n")
        alerts = [json.loads(line) for line in sent if line.strip()]
        # each page names the wait, never twice the same: the one `waiting` alert of a node
        # whose peers had not all shared a finding when its wait passed remote_wait_s (a node
        # that said nothing may not be under dflashd: by design), and its end's if that pages
        # (a hung end does, a crash after the peer's end does not by default).  Unloaded, the
        # node ended first pages its end and its peer `waiting`; under load a peer's first
        # round comes late, and the node ended by the store pages both
        verdicts = [a["verdict"] for a in alerts]
        end = ended.fields["verdict"]
        assert verdicts in (["waiting"], [end], ["waiting", end]), alerts
        assert all("recv" in json.dumps(a) for a in alerts), alerts
    assert ended_by_store, "at least one node ended the stuck world from the store's reports"


def test_a_rank_frozen_in_its_own_code_is_ended_by_its_node_and_the_job_completes(
    tmp_path: Path,
) -> None:
    port = free_port()
    args = ["20", "0", "40", "freeze"]
    nodes = [_node(tmp_path, "a", port, True, args), _node(tmp_path, "b", port, False, args)]
    try:
        for node in nodes:
            node.start()
        done = [
            node.wait_for(lambda r: isinstance(r, EventRecord) and r.event == "done", timeout=400)
            for node in nodes
        ]
    finally:
        for node in nodes:
            run_cli("stop", "--home", str(node.home), "--timeout", "5")
    assert [d.fields["verdict"] for d in done if isinstance(d, EventRecord)] == ["completed"] * 2
    holder = nodes[1].events("exit")
    assert holder[0].fields["verdict"] == "stalled" and holder[0].fields["reason"] == "hung"
    assert holder[0].fields["hung_after_s"] <= 60, holder[0].fields
    (culprit,) = [t for t in holder[0].fields["stacks"]["top"] if "worker rank 1" in t]
    assert "eval_then_barrier.py" in culprit and "distributed" not in culprit, culprit
    waiter = nodes[0].events("exit")
    assert waiter[0].fields["verdict"] != "stalled", waiter[0].fields  # never ended by A
    assert not nodes[0].events("ending_run")
