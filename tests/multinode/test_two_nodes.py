"""Two nodes on one host in CI (CPU, gloo): the guide's "Many nodes" recipe (docs/guide.md), faults included.

See :mod:`tests.multinode.two_nodes` for the scenario.  Its figures (time from each kill to
the next step on each node) are printed; ``pytest -s`` shows them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multinode.two_nodes import run_scenario

pytestmark = pytest.mark.trainer

# --dist-timeout-s 20: a process-group setup that hangs after a restart fails in 20 s
# (torchrun then rendezvouses again) instead of the default 120 s.
CPU_TRAINER = ["--workers", "1", "--batch", "4", "--log-every", "5", "--dist-timeout-s", "20"]


def test_two_nodes_survive_a_dead_worker_and_a_dead_agent(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    figures = run_scenario(
        tmp_path / "two-nodes", device="cpu", steps=100000, trainer_extra=CPU_TRAINER, faults=True
    )
    print(json.dumps({k: v for k, v in figures.items() if k != "status"}, indent=1, default=str))
    status = figures["status"]
    for name in ("node-a", "node-b"):
        assert status[name]["node"] == name
        assert status[name]["elastic"]["group_world_size"] == 2
    assert {
        status["node-a"]["elastic"]["group_rank"],
        status["node-b"]["elastic"]["group_rank"],
    } == {0, 1}
    # (a) a worker died: torchrun restarted the group on both nodes; dflashd relaunched nothing.
    assert figures["a_dflashd_runs"] == {"node-a": 1, "node-b": 1}
    assert figures["a_worker_failed_records"] >= 1
    assert figures["a_elastic"]["node-b"]["restarts"] >= 1
    assert all(0 < s < 120 for s in figures["a_worker_killed"].values())
    # (b) node B's agent died: dflashd B ended its orphaned worker and relaunched the agent.
    assert figures["b_orphan_ended"]
    assert figures["b_dflashd_runs"]["node-b"] >= 2
    assert tuple(figures["b_exits"]["node-b"][0][1:]) == ("crashed", "SIGKILL")
    assert all(0 < s < 300 for s in figures["b_agent_killed"].values())
