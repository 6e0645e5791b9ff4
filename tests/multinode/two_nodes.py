"""Two "nodes" on one host: one dflashd per node, each supervising torchrun (docs/guide.md, "Many nodes").

Each node is a dflashd home with its own config; its job is
``torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d`` against a rendezvous on
127.0.0.1, running the bundled trainer with a shared checkpoint directory.  The scenario:

1. both nodes reach their first step;
2. (a) node B's worker is SIGKILLed: torchrun restarts the workers on both nodes, they
   resume from rank 0's checkpoint, and neither dflashd relaunches anything;
3. (b) node B's torchrun agent is SIGKILLed: dflashd B ends the orphaned worker, relaunches
   the agent, it rejoins the rendezvous and both nodes train on.

For each fault it measures the time from the kill to the next step on each node (the first
``step N/`` line after the restarted worker's ``resumed from`` line).  Used by
``tests/multinode/test_two_nodes.py`` (CPU, gloo, in CI) and by
``tests/gpu/run_two_nodes_gpu.sh`` (two H200s, NCCL).  Standalone: no pytest needed.

    python -m tests.multinode.two_nodes --workdir /tmp/x [--device cuda] [--baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, LineRecord, Record, follow, read_records
from dflashd.logs.records import parse_timestamp
from tests.helpers import run_cli, write_config

STEP_LINE = re.compile(r"^step (\d+)/\d+ loss ([\d.]+) acc [\d.]+ tok/s ([\d,]+)")
# Kill to next step: a restarted worker starts and compiles again (17–55 s on two H200s), the
# agent rejoins the rendezvous; well under the GPU script's own limit, so a hang still
# prints the nodes' last records.
FAULT_WAIT_S = 240.0


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768 and up on Linux): a port the kernel
    handed out and this closed could be handed out again, as the source port of any of the
    suite's connections, before the store binds it (a rendezvous that never formed, once)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


@dataclass
class Node:
    """One dflashd home supervising one torchrun agent."""

    name: str
    home: Path
    config: Path
    seen: list[Record] = field(default_factory=list)

    def start(self) -> None:
        done = run_cli("start", "--home", str(self.home), "--config", str(self.config))
        if done.returncode != 0:
            raise RuntimeError(f"dflashd start {self.name}: {done.stdout}{done.stderr}")

    def status(self) -> dict[str, Any]:
        done = run_cli("status", "--home", str(self.home), "--json")
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    def stop(self) -> None:
        run_cli("stop", "--home", str(self.home), "--timeout", "20")

    def records(self) -> list[Record]:
        return list(read_records(self.home / "logs"))

    def wait_for(self, predicate: Callable[[Record], bool], timeout: float) -> Record:
        """Follow the node's log until a record matches (bounded by the deadline)."""
        deadline = time.monotonic() + timeout
        stream: Iterator[Record] = follow(
            self.home / "logs", poll_s=0.05, should_stop=lambda: time.monotonic() > deadline
        )
        with closing(stream):  # type: ignore[type-var]
            for record in stream:
                if predicate(record):
                    return record
        tail = [getattr(r, "line", getattr(r, "event", "")) for r in self.records()[-15:]]
        raise TimeoutError(f"{self.name}: nothing matched within {timeout}s; last: {tail}")

    def next_step_after(self, t0: float, timeout: float) -> float:
        """Seconds from ``t0`` to the first step line after a restarted worker resumed."""
        resumed = [False]

        def match(record: Record) -> bool:
            if not isinstance(record, LineRecord) or parse_timestamp(record.ts) < t0:
                return False
            if record.line.startswith("resumed from"):
                resumed[0] = True
            return resumed[0] and STEP_LINE.match(record.line) is not None

        found = self.wait_for(match, timeout)
        return round(parse_timestamp(found.ts) - t0, 2)

    def events(self, name: str) -> list[EventRecord]:
        return [r for r in self.records() if isinstance(r, EventRecord) and r.event == name]

    def tokens_per_s(self, since: float) -> list[float]:
        rates = []
        for r in self.records():
            if isinstance(r, LineRecord) and parse_timestamp(r.ts) >= since:
                m = STEP_LINE.match(r.line)
                if m:
                    rates.append(float(m.group(3).replace(",", "")))
        return rates


def torchrun() -> list[str]:
    """The torchrun next to this interpreter, else on PATH, else ``python -m torch.distributed.run``."""
    beside = Path(sys.executable).parent / "torchrun"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def make_node(
    root: Path,
    name: str,
    *,
    nnodes: int,
    port: int,
    is_host: bool,
    trainer_args: list[str],
    env: dict[str, str],
    gpus: str | list[int],
) -> Node:
    """Write the node's config: the guide's recipe, with this test's rendezvous port."""
    command = [
        *torchrun(),
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=dflashd-two-nodes",
        # is_host: which agent hosts the rendezvous store (both run on 127.0.0.1 here);
        # read_timeout: how soon a rendezvous stuck on a dead node fails (torch's default: 60 s).
        f"--rdzv-conf=is_host={'true' if is_host else 'false'},read_timeout=15",
        "--max-restarts=3",
        "-m",
        "dflashd.trainer",
        *trainer_args,
    ]
    top = {
        "command": command,
        "node": name,
        "gpus": gpus,
        "env": {
            "LOGLEVEL": "INFO",
            "OMP_NUM_THREADS": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # the recipe's: a fresh store per round
            **env,
        },
        "first_step_timeout_s": 600.0,
    }
    restart = {"backoff_initial_s": 1.0, "backoff_max_s": 5.0, "stop_timeout_s": 20.0}
    config = write_config(root / f"{name}.toml", top, restart=restart)
    return Node(name, root / name, config)


def median_rate(rates: list[float]) -> float | None:
    """The median of the step lines' tok/s (every node prints the job's total)."""
    ordered = sorted(rates)
    return ordered[len(ordered) // 2] if ordered else None


def worker_of(agent_pid: int, script: str = "dflashd.trainer") -> int:
    """The agent's worker: its child running ``script`` (the trainer; nproc-per-node=1)."""
    import psutil

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(agent_pid).children():
            try:
                if child.status() != "zombie" and script in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.1)  # polling another process's tree: no event to wait on
    raise TimeoutError(f"torchrun {agent_pid} started no worker")


def run_scenario(
    root: Path,
    *,
    device: str,
    steps: int,
    trainer_extra: list[str],
    faults: bool,
    checkpoint_every: int = 20,
) -> dict[str, Any]:
    """Both nodes to their first step, then the two faults (when ``faults``); the figures."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ckpt = root / "shared-checkpoints"
    trainer_args = [
        "--device",
        device,
        "--steps",
        str(steps),
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        str(checkpoint_every),
        *trainer_extra,
    ]
    nodes = [
        make_node(
            root,
            name,
            nnodes=2,
            port=port,
            is_host=name == "node-a",
            trainer_args=trainer_args,
            # On one host, a "node" is one GPU: its job sees only it, its dflashd watches only it.
            env={"CUDA_VISIBLE_DEVICES": str(i)} if device == "cuda" else {},
            gpus=[i] if device == "cuda" else "none",
        )
        for i, name in enumerate(("node-a", "node-b"))
    ]
    a, b = nodes
    figures: dict[str, Any] = {}

    def say(text: str) -> None:
        print(f"two_nodes {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)

    try:
        a.start()
        b.start()
        say("both daemons started; waiting for the first steps")
        for node in nodes:
            first = node.wait_for(
                lambda r: isinstance(r, EventRecord) and r.event == "first_step", 600
            )
            assert isinstance(first, EventRecord)
            figures[f"{node.name}_first_step_after_s"] = first.fields["after_s"]
        # A checkpoint exists before any fault (rank 0 saves every --checkpoint-every steps):
        # without one a restarted worker starts afresh and there is no resume to measure.
        for node in nodes:
            node.wait_for(
                lambda r: (
                    isinstance(r, LineRecord)
                    and (m := STEP_LINE.match(r.line)) is not None
                    and int(m.group(1)) >= 2 * checkpoint_every
                ),
                600,
            )
        if not (ckpt / "latest.pt").exists():
            raise TimeoutError(f"no checkpoint in {ckpt} after {2 * checkpoint_every} steps")
        figures["status"] = {node.name: node.status() for node in nodes}
        figures["tok_s_two_nodes_median"] = median_rate(a.tokens_per_s(0.0)[2:])
        if not faults:
            return figures
        say(
            f"both nodes train ({figures['tok_s_two_nodes_median']} tok/s); (a) killing node B's worker"
        )
        # (a) node B's worker dies: torchrun restarts the group on both nodes; dflashd does nothing.
        agent_b = int(figures["status"]["node-b"]["child_pid"])
        worker = worker_of(agent_b)
        t0 = time.time()
        os.kill(worker, signal.SIGKILL)
        figures["a_worker_killed"] = {
            node.name: node.next_step_after(t0, FAULT_WAIT_S) for node in nodes
        }
        figures["a_dflashd_runs"] = {node.name: node.status()["run"] for node in nodes}
        figures["a_elastic"] = {node.name: node.status()["elastic"] for node in nodes}
        figures["a_worker_failed_records"] = len(b.events("worker_failed"))
        say(f"(a) recovered: {figures['a_worker_killed']}; (b) killing node B's agent")
        # (b) node B's agent dies: dflashd B ends its orphaned worker and relaunches the agent.
        agent_b = int(b.status()["child_pid"])
        orphan = worker_of(agent_b)
        t0 = time.time()
        os.kill(agent_b, signal.SIGKILL)
        figures["b_agent_killed"] = {
            "node-a": a.next_step_after(t0, FAULT_WAIT_S),
            "node-b": b.next_step_after(t0, FAULT_WAIT_S),
        }
        figures["b_dflashd_runs"] = {node.name: node.status()["run"] for node in nodes}
        figures["b_exits"] = {
            node.name: [
                (e.run, e.fields["verdict"], e.fields["reason"]) for e in node.events("exit")
            ]
            for node in nodes
        }
        ended = b.events("ending_leftovers")
        figures["b_orphan_ended"] = bool(ended) and str(orphan) in ended[0].fields["pids"]
        figures["elastic_after"] = {node.name: node.status()["elastic"] for node in nodes}
        say(f"(b) recovered: {figures['b_agent_killed']}")
        return figures
    except TimeoutError:
        for node in nodes:
            for r in node.records()[-25:]:
                say(
                    f"{node.name} r{r.run} {getattr(r, 'line', None) or getattr(r, 'event', '')}"[
                        :300
                    ]
                )
        raise
    finally:
        for node in nodes:
            node.stop()


def one_node_baseline(
    root: Path, device: str, steps: int, trainer_extra: list[str]
) -> float | None:
    """The same trainer alone on one GPU (no torchrun), for tokens/s against two nodes."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "dflashd.trainer", "--device", device, "--steps", str(steps)]
    argv += ["--checkpoint-dir", str(root / "baseline-checkpoints"), *trainer_extra]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=True)
    rates = [
        float(m.group(3).replace(",", ""))
        for m in map(STEP_LINE.match, done.stdout.splitlines())
        if m
    ]
    return median_rate(rates[2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--baseline-steps", type=int, default=0, help="also run one node alone")
    parser.add_argument("trainer_extra", nargs="*", help="more trainer arguments (after --)")
    args = parser.parse_args()
    figures = run_scenario(
        args.workdir,
        device=args.device,
        steps=args.steps,
        trainer_extra=args.trainer_extra,
        faults=not args.no_faults,
        checkpoint_every=args.checkpoint_every,
    )
    if args.baseline_steps:
        base = one_node_baseline(args.workdir, args.device, args.baseline_steps, args.trainer_extra)
        figures["tok_s_one_node_median"] = base
        two = figures.get("tok_s_two_nodes_median")
        figures["two_over_one"] = round(two / base, 3) if two and base else None
    print(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
