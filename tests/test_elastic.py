"""torchrun's agent as dflashd reads it: its command line and its log lines (pure functions).

The lines are torchrun 2.13's own, copied from a two-node run on this machine
(``LOGLEVEL=INFO`` for the INFO ones; the worker failure is logged at ERROR, always).
"""

from __future__ import annotations

import pytest

from dflashd.logs.framer import Frame
from dflashd.supervisor.model.agent import AgentSaid
from dflashd.supervisor.watch.elastic import parse_agent_line, scan_frame, torchrun_job

P = "I1130 20:06:16.146000 2164 torch/distributed/elastic/agent/server/api.py:"


@pytest.mark.parametrize(
    ("argv", "nnodes", "endpoint"),
    [
        (
            ["torchrun", "--nnodes=2", "--rdzv-endpoint=h:29400", "train.py", "--nnodes=9"],
            "2",
            "h:29400",
        ),
        (
            ["/opt/venv/bin/torchrun", "--nnodes", "1:4", "--rdzv_endpoint", "h:1", "-m", "x"],
            "1:4",
            "h:1",
        ),
        (["python3", "-m", "torch.distributed.run", "--nnodes=2", "t.py"], "2", None),
        (["env", "LOGLEVEL=INFO", "torchrun", "--nnodes=3", "t.py"], "3", None),
        (["bash", "-c", "cd /w && torchrun --nnodes=2 --rdzv-endpoint=a:2 t.py"], "2", "a:2"),
    ],
)
def test_torchrun_commands_are_recognised(
    argv: list[str], nnodes: str, endpoint: str | None
) -> None:
    job = torchrun_job(argv)
    assert job is not None
    assert (job.nnodes, job.rdzv_endpoint) == (nnodes, endpoint)
    assert job.many_nodes == (nnodes != "1")


@pytest.mark.parametrize(
    "argv",
    [
        ["python3", "train.py", "--torchrun"],
        ["python", "-m", "torch.utils.bottleneck"],
        ["bash", "-c", "echo hi"],
        [],
    ],
)
def test_other_commands_are_not_torchrun(argv: list[str]) -> None:
    assert torchrun_job(argv) is None


@pytest.mark.parametrize(
    ("line", "said", "fields"),
    [
        (
            "E1130 20:01:04.134000 2126 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            "(exitcode: -9) local_rank: 0 (pid: 2133) of binary: /usr/bin/python3",
            AgentSaid.WORKER_FAILED,
            {"exit_code": -9, "local_rank": 0, "pid": 2133},
        ),
        (
            P + "944] [default] Worker group FAILED. 3/3 attempts left; will restart worker group",
            AgentSaid.GROUP_RESTART,
            {"state": "FAILED", "attempts_left": 3, "max_restarts": 3},
        ),
        (
            P + "965] [default] Detected 1 new nodes from group_rank=0; will restart worker group",
            AgentSaid.MEMBERSHIP_RESTART,
            {"new_nodes": 1},
        ),
        (P + "707] [default] Rendezvous'ing worker group", AgentSaid.RENDEZVOUS_WAIT, {}),
        (
            P + "554] [default] Rendezvous complete for workers. Result:",
            AgentSaid.RENDEZVOUS_DONE,
            {},
        ),
        (P + "554]   group_world_size=2", AgentSaid.WORLD, {"group_world_size": 2}),
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
            AgentSaid.RENDEZVOUS_TIMEOUT,
            {},
        ),
    ],
)
def test_agent_lines(line: str, said: AgentSaid, fields: dict[str, object]) -> None:
    found = parse_agent_line(line)
    assert found is not None
    assert (found.said, found.fields) == (said, fields)


def test_a_workers_own_lines_are_not_the_agents() -> None:
    assert parse_agent_line("step 10/300 loss 4.078 acc 0.058 tok/s 23,884") is None
    assert (
        parse_agent_line("Worker group FAILED. 3/3 attempts left") is None
    )  # not the agent's logger


def test_scan_frame_finds_agent_lines_among_many() -> None:
    lines = [f"step {i} loss 1.0" for i in range(1000)]
    lines.insert(
        500, P + "944] [default] Worker group FAILED. 1/3 attempts left; will restart worker group"
    )
    as_bytes = Frame(None, None, 0, "\n".join(lines).encode())
    as_text = Frame(lines, None, 0)
    for frame in (as_bytes, as_text):
        found = scan_frame(frame)
        assert [f.said for f in found] == [AgentSaid.GROUP_RESTART]
    assert scan_frame(Frame(lines[:400], None, 0)) == []


def test_the_node_config_example_is_a_valid_torchrun_job() -> None:
    """systemd/dflashd-node.toml.example (the guide's recipe) loads and is read as a node."""
    from pathlib import Path

    from dflashd.supervisor.host.config import load_config

    example = Path(__file__).parent.parent / "systemd" / "dflashd-node.toml.example"
    config = load_config(example)
    job = torchrun_job(config.command)
    assert config.node_name == "node-a" and config.env["LOGLEVEL"] == "INFO"
    assert config.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert job is not None and job.many_nodes and job.max_restarts == 3
    assert job.rdzv_endpoint == "node-a.cluster:29400"


CHILD_FAILED_TAIL = [  # torchrun 2.13's summary, as it ends a run whose worker exited 78
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "dflashd.trainer FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-30_21:57:31",
    "  host      : localhost",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 78 (pid: 30676) ",
    "  error_file: <N/A>",
    "============================================================",
]


def test_a_workers_no_restart_exit_code_is_fatal_through_torchrun() -> None:
    """torchrun exits 1; the worker's 78 (EX_CONFIG) in its summary still makes the run fatal."""
    from dflashd.supervisor.model.exitcodes import worker_exit_code
    from dflashd.supervisor.model.policy import Action, RestartConfig, RestartHistory, decide
    from dflashd.supervisor.model.verdicts import Verdict

    assert worker_exit_code(CHILD_FAILED_TAIL) == 78
    assert worker_exit_code(["exitcode  : 78"]) is None  # only under torchrun's Root Cause
    decision = decide(
        Verdict.CRASH_BEFORE_FIRST_STEP,
        exit_code=1,
        reached_first_step=False,
        progress_s=0.0,
        history=RestartHistory(),
        policy=RestartConfig(),
        jitter=0.5,
        worker_exit_code=worker_exit_code(CHILD_FAILED_TAIL),
    )
    assert (decision.action, decision.reason) == (Action.FATAL, "no_restart_exit_code_78_in_worker")
