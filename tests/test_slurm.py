"""Issue 55: dflashd under a real Slurm (Debian's slurm-wlm 22.05 and munge): a single-node
cluster started by the fixture (munged, slurmctld, slurmd, each with a config generated under
a temporary directory and each ended by its pid), then jobs as a user submits them.

Skipped, visibly, where Slurm is not installed (``apt-get install slurm-wlm munge``) or the
suite does not run as root (slurmd must be able to become the job's user).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, LineRecord, read_records
from tests.conftest import dflashd_argv, run_cli

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(n) is None for n in NEEDED),
    reason="needs root and Slurm (apt-get install slurm-wlm munge)",
)
CHILDREN = Path(__file__).parent / "children"

# Run 1 crashes at step 3 (dflashd relaunches it); run 2 steps until it is stopped.
JOB = """
import os, sys, time
run = int(os.environ.get("DFLASHD_RUN", "1"))
for step in range(1, 100000):
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if run == 1 and step == 3:
        sys.exit(1)
    time.sleep(0.1)
"""


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    kill_wait_s: int

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def job_state(self, job_id: str) -> dict[str, str]:
        shown = self.run("scontrol", "show", "job", job_id, "-o").stdout
        return dict(word.split("=", 1) for word in shown.split() if "=" in word)


def _slurm_conf(root: Path, host: str, kill_wait_s: int) -> str:
    return f"""ClusterName=dflashd{kill_wait_s}
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait={kill_wait_s}
RequeueExit=75
MpiDefault=none
NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _end(pid_file: Path) -> None:
    """End one of the cluster's daemons by the pid it wrote (never by name)."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)  # a daemon that is not our child: no wait() to block on
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module", params=[5, 30], ids=["killwait5", "killwait30"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="slurm", dir="/tmp"))  # sockets: short paths
    for name in ("state", "spool", "munge"):
        (root / name).mkdir()
    (root / "munge").chmod(0o700)
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, host, request.param))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = root / "munge"
    started = [
        ["munged", f"--key-file={munge}/munge.key", f"--socket={munge}/sock",
         f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed", "-f"],
        ["slurmctld", "-c", "-f", str(conf)],
        ["slurmd", "-f", str(conf)],
    ]  # fmt: skip
    try:
        for argv in started:
            subprocess.run(argv, env=env, check=True, capture_output=True, timeout=30)
        ready = Cluster(root, env, request.param)
        deadline = time.monotonic() + 30
        while "idle" not in ready.run("sinfo", "-h", "-o", "%T").stdout:
            assert time.monotonic() < deadline, (root / "slurmd.log").read_text()[-2000:]
            time.sleep(0.2)  # slurmd registering with slurmctld: no event reaches us
        yield ready
    finally:
        for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", munge / "pid"):
            _end(pid_file)
        shutil.rmtree(root, ignore_errors=True)


def _records(home: Path) -> list[object]:
    return list(read_records(home / "logs")) if (home / "logs").is_dir() else []


def _wait_records(home: Path, done: object, timeout: float = 90) -> list[object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = _records(home)
        if done(records):  # type: ignore[operator]
            return records
        time.sleep(0.2)  # the log written by a daemon Slurm started: polled, as tail does
    raise AssertionError(f"not seen within {timeout}s: {_records(home)[-8:]}")


def _sbatch(cluster: Cluster, work: Path, script: str) -> str:
    path = work / "job.sh"
    path.write_text("#!/bin/bash\n" + script)
    done = cluster.run("sbatch", "--parsable", "-o", str(work / "slurm-%j.out"), str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_srun_dflashd_relaunches_and_scancel_ends_it_inside_killwait(
    cluster: Cluster, tmp_path: Path
) -> None:
    """One daemon per node under srun: Slurm's ids in its records and status, a crash
    relaunched, and ``scancel`` (SIGTERM, SIGKILL after KillWait) answered with the ``exit``
    and ``stopped`` records well inside the grace."""
    work = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    (work / "job.py").write_text(JOB)
    (work / "c.toml").write_text('gpus = "none"\n[restart]\nstop_timeout_s = 3.0\n')
    home = work / "home"
    start = " ".join(dflashd_argv("start", "--foreground", "--quiet", "--home", str(home)))
    job_id = _sbatch(
        cluster,
        work,
        f"srun --ntasks-per-node=1 {start} -c {work}/c.toml -- {sys.executable} {work}/job.py\n",
    )
    try:
        records = _wait_records(
            home,
            lambda rs: any(
                isinstance(r, LineRecord) and r.run == 2 and r.line.startswith("step 3 ")
                for r in rs
            ),
        )
        spawn = next(r for r in records if isinstance(r, EventRecord) and r.event == "spawn")
        assert spawn.fields["placement"]["job"] == job_id, spawn.fields
        assert spawn.fields["placement"]["scheduler"] == "slurm"
        exits = [r for r in records if isinstance(r, EventRecord) and r.event == "exit"]
        assert [e.fields["verdict"] for e in exits] == ["crashed"]
        # the login shell on the node: status against the job's home
        shown = subprocess.run(
            dflashd_argv("status", "--home", str(home)), capture_output=True, text=True
        )
        assert shown.returncode == 0 and "running" in shown.stdout, shown.stdout
        tailed = subprocess.run(
            dflashd_argv("tail", "--home", str(home), "-n", "5"), capture_output=True, text=True
        )
        assert tailed.returncode == 0 and "step " in tailed.stdout, tailed.stdout
        stacks = subprocess.run(
            dflashd_argv("stacks", "--home", str(home)), capture_output=True, text=True
        )
        tool = json.loads(run_cli("status", "--home", str(home), "--json").stdout)["stacks_tool"]
        if str(tool).startswith("py-spy"):  # an extra: where it is installed, it must work
            assert stacks.returncode == 0, stacks.stdout + stacks.stderr
            assert "job.py" in stacks.stdout, stacks.stdout  # the job's own frame, from Slurm's
        asked = time.monotonic()
        assert cluster.run("scancel", job_id).returncode == 0
        records = _wait_records(
            home,
            lambda rs: any(isinstance(r, EventRecord) and r.event == "daemon_exit" for r in rs),
            timeout=cluster.kill_wait_s + 30,
        )
        took = time.monotonic() - asked
        ends = [r for r in records if isinstance(r, EventRecord) and r.event == "exit"]
        assert ends[-1].fields["verdict"] == "stopped", ends[-1].fields
        assert took < cluster.kill_wait_s, f"records {took:.1f}s after scancel"
        print(f"KillWait {cluster.kill_wait_s}s: exit and daemon_exit {took:.2f}s after scancel")
    finally:
        cluster.run("scancel", job_id)
        shutil.rmtree(work, ignore_errors=True)


TORCHRUN_JOB = """
import datetime, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, run = dist.get_rank(), int(os.environ.get("DFLASHD_RUN", "1"))
x = torch.ones(8)
for step in range(1, 100000):
    dist.all_reduce(x)
    if rank == 0:
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if run == 1 and rank == 1 and step == 3:
        sys.exit(1)  # a rank dies: torchrun (no restarts of its own) fails the group
    time.sleep(0.1)
"""


def test_a_two_rank_torchrun_job_under_srun_dflashd_is_relaunched_and_stopped(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The job as a Slurm user runs it: ``srun dflashd start --foreground -- torchrun`` with two
    gloo ranks; a rank's death ends torchrun, dflashd relaunches it, ``scancel`` stops it."""
    pytest.importorskip("torch")
    if cluster.kill_wait_s != 30:
        pytest.skip("once is enough: the KillWait figures come from the test above")
    work = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    (work / "job.py").write_text(TORCHRUN_JOB)
    (work / "c.toml").write_text('gpus = "none"\nfirst_step_timeout_s = 120\n')
    home = work / "home"
    start = " ".join(dflashd_argv("start", "--foreground", "--quiet", "--home", str(home)))
    torchrun = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2"
    job_id = _sbatch(
        cluster,
        work,
        f"srun --ntasks-per-node=1 {start} -c {work}/c.toml -- {torchrun} {work}/job.py\n",
    )
    try:
        records = _wait_records(
            home,
            lambda rs: any(
                isinstance(r, LineRecord) and r.run == 2 and "step 3 " in r.line for r in rs
            ),
            timeout=240,
        )
        spawns = [r for r in records if isinstance(r, EventRecord) and r.event == "spawn"]
        assert spawns[0].fields["placement"]["job"] == job_id
        assert "torchrun" in spawns[0].fields, spawns[0].fields  # read as a torchrun job
        exits = [r for r in records if isinstance(r, EventRecord) and r.event == "exit"]
        assert [e.fields["verdict"] for e in exits] == ["crashed"], [e.fields for e in exits]
        assert cluster.run("scancel", job_id).returncode == 0
        records = _wait_records(
            home,
            lambda rs: any(isinstance(r, EventRecord) and r.event == "daemon_exit" for r in rs),
            timeout=60,
        )
        ends = [r for r in records if isinstance(r, EventRecord) and r.event == "exit"]
        assert ends[-1].fields["verdict"] == "stopped", ends[-1].fields
    finally:
        cluster.run("scancel", job_id)
        shutil.rmtree(work, ignore_errors=True)


def test_exit_75_is_requeued_by_slurms_requeueexit(cluster: Cluster, tmp_path: Path) -> None:
    """dflashd's exit 75 (a GPU that needs a reset, EX_TEMPFAIL): with ``RequeueExit=75`` in
    slurm.conf, Slurm puts the batch job back in the queue on its own (pending again, its
    restart counted; Slurm holds a requeued job back about two minutes before it may run)."""
    work = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    job_id = ""
    try:
        job_id = _sbatch(cluster, work, "exit 75\n")
        deadline = time.monotonic() + 60
        state = cluster.job_state(job_id)
        while state.get("Restarts") != "1" and time.monotonic() < deadline:
            time.sleep(0.2)  # polled through scontrol, as a user would
            state = cluster.job_state(job_id)
        assert state.get("Restarts") == "1" and state["JobState"] == "PENDING", state
        assert state.get("ExitCode") == "75:0", state
    finally:
        if job_id:
            cluster.run("scancel", job_id)
        shutil.rmtree(work, ignore_errors=True)
