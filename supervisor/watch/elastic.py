"""A node of a larger job: what torchrun's elastic agent says, as dflashd sees it.

dflashd does not reinvent torch elastic: ``torchrun`` restarts a job's workers across the
nodes (``--max-restarts``), and dflashd supervises the agent like any job.  What this module
adds is reading the agent: its command line (how many nodes, which rendezvous), and its
log lines (a worker failed, the group restarted, the rendezvous is waiting or complete),
so that a restart torchrun handled itself is visible in the log and in ``status`` without
dflashd restarting anything, and a node waiting for its peers is not taken for a stall.

Everything here is pure (argv in, options out; a line in, an :class:`AgentLine` out) and
runs on the drain threads only as :func:`scan_frame`, which costs one joined search per
frame and parses only the rare lines that carry a keyword.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Any, Final

from dflashd.logs.framer import Frame
from dflashd.supervisor.model.agent import AgentLine, AgentSaid, TorchrunJob

_SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh"})
_OPTIONS: Final = {
    "nnodes": "nnodes",
    "nproc-per-node": "nproc_per_node",
    "nproc_per_node": "nproc_per_node",
    "rdzv-backend": "rdzv_backend",
    "rdzv_backend": "rdzv_backend",
    "rdzv-endpoint": "rdzv_endpoint",
    "rdzv_endpoint": "rdzv_endpoint",
    "rdzv-id": "rdzv_id",
    "rdzv_id": "rdzv_id",
    "max-restarts": "max_restarts",
    "max_restarts": "max_restarts",
    "node-rank": "node_rank",
    "node_rank": "node_rank",
}


def _agent_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``torchrun`` (or ``python -m torch.distributed.run``), else None."""
    words = list(argv)
    if words and os.path.basename(words[0]) == "env":  # env [VAR=value ...] torchrun ...
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]
    if not words:
        return None
    program = os.path.basename(words[0])
    if program == "torchrun":
        return words[1:]
    if program.startswith("python") and "-m" in words:
        at = words.index("-m")
        if words[at + 1 : at + 2] == ["torch.distributed.run"]:
            return words[at + 2 :]
    return None


def torchrun_job(argv: Sequence[str]) -> TorchrunJob | None:
    """The torchrun options of a command, or None when it does not run torchrun.

    Recognised: ``torchrun …``, ``python -m torch.distributed.run …``, either behind
    ``env VAR=…``, and ``sh -c "… torchrun …"`` (the string split as the shell would).
    """
    if len(argv) >= 3 and os.path.basename(argv[0]) in _SHELLS and "-c" in argv[1:-1]:
        try:
            words = shlex.split(argv[argv.index("-c") + 1], comments=True)
        except ValueError:
            return None
        starts = [i for i, w in enumerate(words) if os.path.basename(w) == "torchrun"]
        return torchrun_job(words[starts[0] :]) if starts else None
    args = _agent_args(argv)
    if args is None:
        return None
    found: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            break  # the training script: the rest is its own
        name, eq, value = arg[2:].partition("=")
        key = _OPTIONS.get(name)
        if key is not None and not eq and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        if key == "max_restarts":
            found[key] = int(value) if value.isdigit() else None
        elif key is not None:
            found[key] = value
        i += 1
    return TorchrunJob(**found)


def _ints(match: re.Match[str], *names: str) -> dict[str, Any]:
    return {n: int(match.group(n)) for n in names if match.group(n) is not None}


_WORKER_FAILED: Final = re.compile(
    r"failed \(exitcode: (?P<exit_code>-?\d+)\) local_rank: (?P<local_rank>\d+)"
    r"(?: \(pid: (?P<pid>\d+)\))?"
)
_GROUP_RESTART: Final = re.compile(
    r"Worker group (?P<state>[A-Z]+)\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left"
)
_MEMBERSHIP: Final = re.compile(r"Detected (?P<new_nodes>\d+) new nodes")
_JOINED: Final = re.compile(
    r"has joined round (?P<round>\d+) of the rendezvous '[^']*' as rank (?P<group_rank>\d+) "
    r"in a world of size (?P<group_world_size>\d+)"
)
_WORLD: Final = re.compile(r"\]\s+(?P<key>group_rank|group_world_size)=(?P<value>\d+)\s*$")

# Every line worth parsing holds one of these (checked on the joined frame first).
AGENT_KEYWORDS: Final = (
    "torch/distributed/elastic",
    "torch.distributed.elastic",
    "RendezvousTimeoutError",
)
_AGENT_KEYWORDS_B: Final = tuple(k.encode() for k in AGENT_KEYWORDS)


def parse_agent_line(line: str) -> AgentLine | None:
    """What one line of torchrun's agent says, or None (most lines: the workers' own)."""
    if "RendezvousTimeoutError" in line:
        return AgentLine(AgentSaid.RENDEZVOUS_TIMEOUT)
    if "elastic" not in line:
        return None
    if (m := _WORKER_FAILED.search(line)) is not None:
        return AgentLine(AgentSaid.WORKER_FAILED, _ints(m, "exit_code", "local_rank", "pid"))
    if (m := _GROUP_RESTART.search(line)) is not None:
        fields = _ints(m, "attempts_left", "max_restarts")
        return AgentLine(AgentSaid.GROUP_RESTART, {"state": m.group("state"), **fields})
    if (m := _MEMBERSHIP.search(line)) is not None:
        return AgentLine(AgentSaid.MEMBERSHIP_RESTART, _ints(m, "new_nodes"))
    if "Rendezvous'ing worker group" in line:
        return AgentLine(AgentSaid.RENDEZVOUS_WAIT)
    if "Rendezvous complete" in line:
        return AgentLine(AgentSaid.RENDEZVOUS_DONE)
    if (m := _JOINED.search(line)) is not None:
        return AgentLine(
            AgentSaid.RENDEZVOUS_DONE, _ints(m, "round", "group_rank", "group_world_size")
        )
    if (m := _WORLD.search(line)) is not None:
        return AgentLine(AgentSaid.WORLD, {m.group("key"): int(m.group("value"))})
    return None


def scan_frame(frame: Frame) -> list[AgentLine]:
    """The agent lines of one frame: one search of the joined text, then only keyword lines."""
    if frame.text is not None:
        if not any(k in frame.text for k in _AGENT_KEYWORDS_B):
            return []
        raw = frame.text.split(b"\n")
        texts = [r.decode("ascii") for r in raw if any(k in r for k in _AGENT_KEYWORDS_B)]
    else:
        lines = frame.lines
        joined = "\n".join(lines)
        if not any(k in joined for k in AGENT_KEYWORDS):
            return []
        texts = [t for t in lines if any(k in t for k in AGENT_KEYWORDS)]
    return [found for t in texts if (found := parse_agent_line(t)) is not None]
