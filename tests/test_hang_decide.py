"""The hang decider as a table (judge.judge, hang.decide): no process, no clock, no py-spy."""

from __future__ import annotations

import pytest

from dflashd.supervisor.model.hang import (
    EndHung,
    Evidence,
    HangLimits,
    HangView,
    NewRound,
    QuickOver,
    TakeSample,
    Wait,
    decide,
    suspect_after,
)
from dflashd.supervisor.model.judge import Finding, Sample, judge
from dflashd.supervisor.model.stacks import ProcessStacks, Role, StackFrame, ThreadStack
from dflashd.supervisor.model.world import ProcessSample

LOCK = StackFrame("acquire", "threading.py", 100)
MAIN = StackFrame("train", "train.py", 42)
ALL_REDUCE = StackFrame("all_reduce", "torch/distributed/distributed_c10d.py", 2050)
MATMUL = StackFrame("eval_step", "train.py", 77)


def proc(
    pid: int,
    *frames: StackFrame,
    active: bool = False,
    wrote: int = 0,
    states: tuple[str, ...] = ("S",),
    role: Role | None = None,
    cpu: float = 0.0,
) -> ProcessSample:
    thread = ThreadStack(pid, "MainThread", active, False, tuple(frames))
    stacks = ProcessStacks(pid, role or Role("root"), (thread,))
    return ProcessSample(stacks, wrote, states, cpu)


def native(pid: int, cpu: float, states: tuple[str, ...] = ("S",)) -> ProcessSample:
    """A process of the run that is not Python: no stacks, its OS view only."""
    return ProcessSample(ProcessStacks(pid, Role("process"), (), "not Python"), 0, states, cpu)


def samples(*rounds: tuple[ProcessSample, ...], gap: float = 4.0) -> list[Sample]:
    return [Sample(100.0 + i * gap, procs) for i, procs in enumerate(rounds)]


WORKER0 = Role("worker", 0, 0)
WORKER1 = Role("worker", 1, 1)


@pytest.mark.parametrize(
    ("rounds", "finding"),
    [
        # three samples, every thread in a lock, unmoved, nothing written: hung
        ([(proc(1, LOCK, MAIN),)] * 3, Finding.HUNG),
        # two samples agree so far: not yet
        ([(proc(1, LOCK, MAIN),)] * 2, Finding.UNDECIDED),
        # the stack moved between samples: working
        (
            [
                (proc(1, LOCK, MAIN),),
                (proc(1, StackFrame("acquire", "threading.py", 101), MAIN),),
                (proc(1, LOCK, MAIN),),
            ],
            Finding.WORKING,
        ),
        # it wrote (a checkpoint) while waiting in write-back: working
        (
            [
                (proc(1, LOCK, MAIN, wrote=0),),
                (proc(1, LOCK, MAIN, wrote=0),),
                (proc(1, LOCK, MAIN, wrote=1 << 20),),
            ],
            Finding.WORKING,
        ),
        # a thread in an uninterruptible I/O wait: working
        ([(proc(1, LOCK, MAIN, states=("D",)),)] * 3, Finding.WORKING),
        # running outside any wait, even unmoved (a long kernel in C): working
        ([(proc(1, MATMUL, active=True),)] * 3, Finding.WORKING),
        # an idle thread (py-spy: not active) in the user's own frame: a wait (a socket read in C)
        ([(proc(1, MAIN, active=False),)] * 3, Finding.HUNG),
        # a collective that spins (active) is still a wait
        ([(proc(1, ALL_REDUCE, MAIN, active=True),)] * 3, Finding.HUNG),
        # no stacks at all: unknown (the stall window decides)
        (
            [(ProcessSample(ProcessStacks(1, Role("root"), (), "ptrace refused")),)] * 3,
            Finding.UNKNOWN,
        ),
        # torchrun: the agent's monitor loop moves, the two workers wait unmoved: hung
        (
            [
                (
                    proc(1, MATMUL, active=True),
                    proc(2, ALL_REDUCE, role=WORKER0),
                    proc(3, LOCK, MAIN, role=WORKER1),
                )
            ]
            * 3,
            Finding.HUNG,
        ),
    ],
)
def test_judge(rounds: list[tuple[ProcessSample, ...]], finding: Finding) -> None:
    assert judge(samples(*rounds)).finding is finding


@pytest.mark.parametrize(
    ("cpus", "frames", "finding"),
    [
        # a waiting Python thread over a native pool that computes (1 CPU-second a second)
        ((0.0, 4.0, 8.0), (LOCK, MAIN), Finding.WORKING),
        # the same CPU while inside a collective: a spin, no sign of work
        ((0.0, 4.0, 8.0), (ALL_REDUCE, MAIN), Finding.HUNG),
        # a heartbeat thread's crumbs of CPU: still hung
        ((0.0, 0.01, 0.02), (LOCK, MAIN), Finding.HUNG),
    ],
)
def test_cpu_under_waiting_threads(
    cpus: tuple[float, ...], frames: tuple[StackFrame, ...], finding: Finding
) -> None:
    rounds = [(proc(1, *frames, cpu=cpu),) for cpu in cpus]
    assert judge(samples(*rounds)).finding is finding


def test_a_busy_process_that_is_not_python_is_work() -> None:
    """A Python launcher waits on a C++ trainer it started: the trainer's CPU is the work."""
    rounds = [
        (proc(1, StackFrame("wait", "subprocess.py", 1200)), native(2, cpu)) for cpu in (0, 3, 6)
    ]
    assert judge(samples(*rounds)).finding is Finding.WORKING
    idle = [(proc(1, StackFrame("wait", "subprocess.py", 1200)), native(2, 1.0)) for _ in range(3)]
    assert judge(samples(*idle)).finding is Finding.HUNG


SYNC = StackFrame("synchronize", "torch/cuda/__init__.py", 1162)


@pytest.mark.parametrize(
    ("rounds", "gpu_idle", "finding"),
    [
        # a GPU-bound eval: the main thread always in synchronize, the GPU busy: working
        ([(proc(1, SYNC, MAIN, active=True),)] * 3, False, Finding.WORKING),
        # the same frames with the GPU idle: nothing will ever finish: hung
        ([(proc(1, SYNC, MAIN, active=True),)] * 3, True, Finding.HUNG),
        # two ranks: one spins in its GPU (NCCL), the other is frozen on a lock: hung
        (
            [(proc(2, SYNC, MAIN, role=WORKER0, active=True), proc(3, LOCK, MAIN, role=WORKER1))]
            * 3,
            False,
            Finding.HUNG,
        ),
        # two ranks evaluating on busy GPUs: working
        (
            [
                (
                    proc(2, SYNC, MAIN, role=WORKER0, active=True),
                    proc(3, SYNC, MAIN, role=WORKER1, active=True),
                )
            ]
            * 3,
            False,
            Finding.WORKING,
        ),
    ],
)
def test_judge_with_the_gpus(
    rounds: list[tuple[ProcessSample, ...]], gpu_idle: bool, finding: Finding
) -> None:
    assert judge(samples(*rounds), gpu_idle).finding is finding


def test_the_cadence_sets_the_suspicion_gap() -> None:
    limits = HangLimits(30.0)
    assert suspect_after((0.1,) * 4, limits) is None  # not steady yet
    assert suspect_after((0.1,) * 5, limits) == 30.0
    assert suspect_after((10.0,) * 8, limits) == 60.0  # six slow intervals
    assert suspect_after((0.1,) * 8, HangLimits(0.0)) is None  # off


def test_many_steps_in_few_posts_are_a_steady_cadence() -> None:
    """A job of 1 ms steps shows 150 of them in one or two posts (steps are posted four times
    a second): hung at once, it was never suspect before its 15-minute stall window."""
    limits = HangLimits(12.0)
    assert suspect_after((0.25,), limits, steps_seen=149) == 12.0
    assert suspect_after((0.25,), limits, steps_seen=19) is None  # a few steps: not yet
    assert suspect_after((), limits, steps_seen=149) is None  # one post: no cadence at all
    view = HangView(100.0, (0.25,), True, True, steps_seen=149)
    assert decide(view, Evidence(), 100.0 + 4.0, limits) == TakeSample(quick=True)


STEADY = (0.1,) * 10
HUNG3 = tuple(samples(*[(proc(1, LOCK, MAIN),)] * 3, gap=4.0))
LOOKED = Evidence(quick_for=100.0)  # the silence since the step at 100 had its quick look


def QUICK(
    count: int,
    *,
    cpu: float = 0.0,
    wrote: int = 0,
    active: bool = False,
    state: str = "S",
    frame: StackFrame = LOCK,
    elsewhere: bool = False,
) -> Evidence:
    """A quick look's ``count`` samples, a second apart from 104.2; the last one as told."""
    role = Role("worker", 0, 0, 4, 2) if elsewhere else Role("root")
    frame = ALL_REDUCE if elsewhere else frame
    taken = []
    for i in range(count):
        last = i == count - 1
        thread = ThreadStack(1, "MainThread", active and last, False, (frame, MAIN))
        stacks = ProcessStacks(1, role, (thread,))
        moved = (cpu if last else 0.0, wrote if last else 0)
        states = (state,) if last else ("S",)
        process = ProcessSample(stacks, moved[1], states, moved[0], read_bytes=0)
        taken.append(Sample(104.2 + i, (process,)))
    return Evidence(tuple(taken), quick=True, quick_for=100.0)


@pytest.mark.parametrize(
    ("view", "evidence", "now", "expected"),
    [
        # the quick look had (quick_for): before the gap, wait until the run would be suspect
        (HangView(100.0, STEADY, True, True), LOOKED, 110.0, Wait(130.0)),
        # suspect, no sample yet: take one
        (HangView(100.0, STEADY, True, True), LOOKED, 131.0, TakeSample()),
        # a sample in flight: wait for it
        (HangView(100.0, STEADY, True, True, sampling=True), LOOKED, 131.0, Wait(None)),
        # no stacks: the stall window decides
        (HangView(100.0, STEADY, False, True), Evidence(), 131.0, Wait(None)),
        (HangView(100.0, STEADY, True, False), Evidence(), 131.0, Wait(None)),
        # no steady cadence: nothing
        (HangView(100.0, (0.1,), True, True), Evidence(), 500.0, Wait(None)),
        # one sample: the next one SAMPLE_GAP_S later
        (
            HangView(60.0, STEADY, True, True),
            Evidence(HUNG3[:1], quick_for=60.0),
            101.0,
            Wait(103.0),
        ),
        (
            HangView(60.0, STEADY, True, True),
            Evidence(HUNG3[:1], quick_for=60.0),
            103.5,
            TakeSample(),
        ),
        # three that agree: end it, with the gap since the last step
        (HangView(60.0, STEADY, True, True), Evidence(HUNG3, quick_for=60.0), 108.0, "end"),
        # a round that found work: a new round later
        (
            HangView(60.0, STEADY, True, True),
            Evidence(tuple(samples((proc(1, MATMUL, active=True),))), quick_for=60.0),
            101.0,
            "round",
        ),
        # after such a round: wait for the next one
        (
            HangView(60.0, STEADY, True, True),
            Evidence((), 120.0, quick_for=60.0),
            110.0,
            Wait(120.0),
        ),
        # the quick look (issue 51): 4 s (four typical intervals, at least 4 s) after the last
        # step, sampled a second apart while nothing moves
        (HangView(100.0, STEADY, True, True), Evidence(), 102.0, Wait(104.0)),
        (HangView(100.0, STEADY, True, True), Evidence(), 104.2, TakeSample(quick=True)),
        (HangView(100.0, STEADY, True, True), QUICK(1), 104.5, Wait(105.2)),
        (HangView(100.0, STEADY, True, True), QUICK(2), 106.2, TakeSample(quick=True)),
        (HangView(100.0, STEADY, True, True), QUICK(3), 106.8, "quick end"),
        # a sign of work: back to the long path, at its own suspicion (130)
        (HangView(100.0, STEADY, True, True), QUICK(2, cpu=0.5), 105.6, "back"),
        (HangView(100.0, STEADY, True, True), QUICK(2, wrote=65536), 105.6, "back"),
        (HangView(100.0, STEADY, True, True), QUICK(1, active=True, frame=MATMUL), 104.6, "back"),
        (HangView(100.0, STEADY, True, True), QUICK(2, state="D"), 105.6, "back"),
        (HangView(100.0, STEADY, True, True), QUICK(1, frame=SYNC), 104.6, "back"),  # GPU?
        (
            HangView(100.0, STEADY, True, True, gpu_idle=True),
            QUICK(3, frame=SYNC),
            106.8,
            "quick end",
        ),
        (HangView(100.0, STEADY, True, True), QUICK(1, elsewhere=True), 104.6, "back"),
        # one quick look per silence: after it, the long path only
        (HangView(100.0, STEADY, True, True), LOOKED, 120.0, Wait(130.0)),
        # a slow cadence: the long path comes first (6 x 10 s = 60 s, the quick 40 s)
        (HangView(100.0, (10.0,) * 8, True, True), Evidence(), 110.0, Wait(140.0)),
    ],
)
def test_decide(view: HangView, evidence: Evidence, now: float, expected: object) -> None:
    action = decide(view, evidence, now, HangLimits(30.0))
    if expected == "quick end":
        assert isinstance(action, EndHung) and action.hung_after_s == round(now - 100.0, 3)
    elif expected == "back":
        assert isinstance(action, QuickOver) and action.at == 130.0, action
    elif expected == "end":
        assert isinstance(action, EndHung) and action.hung_after_s == 48.0
        assert action.judgement.frames
    elif expected == "round":
        assert isinstance(action, NewRound) and action.judgement.finding is Finding.WORKING
        assert action.at > now
    else:
        assert action == expected


# -- Hangs II: judged as a whole (issue 41) ---------------------------------------------------

BARRIER = StackFrame("barrier", "torch/distributed/distributed_c10d.py", 4100)
SLEEP = StackFrame("sleep", "train.py", 12)
REMOTE0 = Role("worker", 0, 0, 2, 1)  # rank 0 of 2, one rank on this node: a remote peer
REMOTE1 = Role("worker", 1, 0, 2, 1)


def io(
    pid: int, frame: StackFrame, *, read: int = 0, wrote: int = 0, outside: str = ""
) -> ProcessSample:
    thread = ThreadStack(pid, "MainThread", False, False, (frame, MAIN))
    stacks = ProcessStacks(pid, Role("root"), (thread,))
    waits = (outside,) if outside else ()
    return ProcessSample(stacks, wrote, ("S",), 0.0, read, waits)


@pytest.mark.parametrize(
    ("rounds", "finding"),
    [
        # the only rank here waits in a barrier while the world reaches another node: elsewhere
        ([(proc(2, BARRIER, MAIN, role=REMOTE1),)] * 3, Finding.ELSEWHERE),
        # the same rank alone in the world (one node): its peers are all here, so hung
        ([(proc(2, BARRIER, MAIN, role=WORKER1),)] * 3, Finding.HUNG),
        # remote peers, but the rank here waits in its own code: the culprit is here, hung
        ([(proc(2, SLEEP, MAIN, role=REMOTE1),)] * 3, Finding.HUNG),
        # a stream read at 100 KB/s (400 KB between samples): working
        ([(io(1, LOCK, read=i * 400_000),) for i in range(3)], Finding.WORKING),
        # a heartbeat thread's 17 bytes a round are not work: hung
        ([(io(1, LOCK, wrote=i * 17),) for i in range(3)], Finding.HUNG),
        # a checkpoint's megabytes are
        ([(io(1, LOCK, wrote=i << 20),) for i in range(3)], Finding.WORKING),
        # a file lock another job holds: its work is elsewhere
        (
            [(io(1, LOCK, outside="pid 1 waits on a file lock held by pid 9, outside"),)] * 3,
            Finding.ELSEWHERE,
        ),
    ],
)
def test_judge_as_a_whole(rounds: list[tuple[ProcessSample, ...]], finding: Finding) -> None:
    assert judge(samples(*rounds)).finding is finding


def test_a_wait_elsewhere_is_never_ended_and_alerted_once_after_remote_wait_s() -> None:
    rounds = samples(*[(proc(2, BARRIER, MAIN, role=REMOTE1),)] * 3)
    view = HangView(50.0, (1.0,) * 10, True, True)
    limits = HangLimits(30.0, remote_wait_s=60.0)
    first = decide(view, Evidence(tuple(rounds)), 120.0, limits)
    assert isinstance(first, NewRound) and not first.alert
    assert "wait in barrier" in first.judgement.why
    later = decide(view, Evidence(tuple(rounds), None, 100.0), 170.0, limits)
    assert isinstance(later, NewRound) and later.alert
    said = decide(view, Evidence(tuple(rounds), None, 100.0, True), 400.0, limits)
    assert isinstance(said, NewRound) and not said.alert


def test_a_world_every_node_of_which_waits_is_ended_and_one_that_works_is_not() -> None:
    """The store's reports ride on a round's sample (decide/world.py): every node waited
    ``remote_wait_s`` -> ended as hung with the wait named; a node at work -> no alert."""
    from dflashd.supervisor.model.world import WAITING, WORKING, NodeReport, WorldHeard

    procs = (proc(2, BARRIER, MAIN, role=REMOTE1),)
    view = HangView(50.0, (1.0,) * 10, True, True, node=1)
    limits = HangLimits(30.0, remote_wait_s=60.0)
    other = NodeReport(0, WAITING, 70.0, "rank(s) [0] of 2 wait in barrier", 4.0)
    stuck = [Sample(100.0, procs, WorldHeard(2, (other,))), *samples(procs, procs, procs)[1:]]
    ended = decide(view, Evidence(tuple(stuck), None, 100.0), 170.0, limits)
    assert isinstance(ended, EndHung)
    assert "every node of the world waits" in ended.judgement.why
    working = NodeReport(0, WORKING, 0.0, "pid 7 runs evaluate", 4.0)
    busy = [Sample(100.0, procs, WorldHeard(2, (working,))), *samples(procs, procs, procs)[1:]]
    waits = decide(view, Evidence(tuple(busy), None, 100.0), 170.0, limits)
    assert isinstance(waits, NewRound) and not waits.alert  # the wait is for that work


def test_status_shows_the_frames_that_proved_a_hang_not_the_step_lines() -> None:
    from dflashd.supervisor.client.render import format_status

    status = {
        "state": "backoff",
        "last_exit": {
            "run": 3,
            "verdict": "stalled",
            "reason": "hung",
            "signal": "SIGKILL",
            "duration_s": 80.0,
            "tail": ["step 40 loss 0.0250"],
            "stacks": {
                "path": "/h/logs/stacks/run-3-hang.txt",
                "top": ["root pid 7: acquire (threading.py:320) <- load (data.py:88)"],
            },
        },
    }
    text = format_status(status, running=True, paint=lambda text, _style: text)
    assert "acquire (threading.py:320)" in text and "cat /h/logs/stacks/run-3-hang.txt" in text
    assert "step 40 loss" not in text


SYNC = StackFrame("synchronize", "torch/cuda/__init__.py", 985)
EVAL_LOOP = StackFrame("evaluate", "train.py", 120)


def gpu_proc(loop_index: int | None) -> ProcessSample:
    """A process waiting in ``torch.cuda.synchronize`` under its eval loop; ``loop_index``:
    its loop variable as py-spy's ``--locals`` read it (None: no locals read)."""
    key = 0 if loop_index is None else hash((("i", str(loop_index)),))
    thread = ThreadStack(7, "MainThread", False, False, (SYNC, EVAL_LOOP), key)
    return ProcessSample(ProcessStacks(7, Role("root"), (thread,)), 0, ("R",), 3.0)


def test_a_gpu_that_spins_is_a_hang_and_a_gpu_eval_whose_loop_moves_is_not() -> None:
    """Issue 41: the same frames *and* locals waiting on a busy GPU across rounds spanning
    GPU_SPIN_S is gpu_spin; an eval in the same frame whose loop variable changes is work,
    and with no locals read nothing is ever called a spin."""
    from dflashd.supervisor.model.gpuspin import GPU_SPIN_S

    view = HangView(50.0, (1.0,) * 10, True, True, gpu_power_share=0.2)
    limits = HangLimits(12.0)
    spinning = samples((gpu_proc(41),), (gpu_proc(41),), (gpu_proc(41),))
    first = decide(view, Evidence(tuple(spinning)), 120.0, limits)
    assert isinstance(first, NewRound) and first.judgement.finding is Finding.GPU_WAIT
    key = first.judgement.key
    assert key is not None
    not_yet = Evidence(tuple(spinning), gpu_wait=(key, 120.0))
    assert isinstance(decide(view, not_yet, 120.0 + GPU_SPIN_S - 1, limits), NewRound)
    ended = decide(view, not_yet, 120.0 + GPU_SPIN_S, limits)
    assert isinstance(ended, EndHung) and ended.judgement.why.startswith("gpu_spin:")
    assert "synchronize" in " ".join(ended.judgement.frames)
    # the same unmoved frames and locals at the power the run drew while stepping: an eval
    # whose loop is module-level code (no locals move): never a spin; nor with no power read
    for share in (0.9, None):
        full = HangView(50.0, (1.0,) * 10, True, True, gpu_power_share=share)
        assert isinstance(decide(full, not_yet, 120.0 + GPU_SPIN_S * 3, limits), NewRound)
    # an eval: the same frame every sample, its loop index moving
    evaluating = samples((gpu_proc(41),), (gpu_proc(42),), (gpu_proc(44),))
    found = decide(view, Evidence(tuple(evaluating), gpu_wait=(key, 0.0)), 500.0, limits)
    assert isinstance(found, NewRound) and found.judgement.finding is Finding.WORKING
    # no locals read: the old rule (a busy GPU is work), never a spin
    unread = samples((gpu_proc(None),), (gpu_proc(None),), (gpu_proc(None),))
    found = decide(view, Evidence(tuple(unread)), 500.0, limits)
    assert isinstance(found, NewRound) and found.judgement.finding is Finding.WORKING
    # an idle GPU under the same wait stays a plain hang, as before
    idle = HangView(50.0, (1.0,) * 10, True, True, gpu_idle=True)
    assert isinstance(decide(idle, Evidence(tuple(spinning)), 120.0, limits), EndHung)


def test_the_quick_look_waits_half_again_the_longest_pause_the_run_came_back_from() -> None:
    from dflashd.supervisor.model.quicklook import quick_after

    gap = suspect_after(STEADY, HangLimits(30.0))  # the long path's suspicion: 30 s
    assert quick_after(STEADY, gap) == 4.0
    assert quick_after((1.5,) * 8, gap) == 6.0  # four typical intervals
    assert quick_after(STEADY, gap, longest_pause_s=6.0) == 9.0  # a 6 s checkpoint came back
    assert quick_after(STEADY, gap, longest_pause_s=25.0) is None  # the long path only
    assert quick_after(STEADY, None) is None  # no steady cadence: no look at all


def test_a_wait_elsewhere_seen_in_any_sample_of_the_round_holds() -> None:
    """A wait channel is read at one instant: a thread that a slow stream's chunk (or a loaded
    CPU late to run it) woke at the last sample shows no wait there; the earlier samples'
    evidence that its other end is outside the run still holds (never a hang for that)."""
    from dataclasses import replace

    said = ("pid 1 reads a socket from pid 9 (127.0.0.1:7000), outside the run",)
    waiting = replace(proc(1, LOCK, MAIN), outside_waits=said)
    woken = proc(1, LOCK, MAIN)  # the same stacks, no wait channel caught this time
    found = judge(samples((waiting,), (waiting,), (woken,)))
    assert found.finding is Finding.ELSEWHERE and "outside the run" in found.why
    assert judge(samples((woken,), (woken,), (woken,))).finding is Finding.HUNG


def test_a_process_stopped_by_a_signal_is_paused_from_outside_never_hung() -> None:
    """An operator's SIGSTOP (or a frozen rendezvous host's agent): every thread in T, no CPU,
    stacks unmoved; SIGCONT resumes it, so it waits elsewhere (the stall window still holds)."""
    from dataclasses import replace

    stopped = replace(proc(1, LOCK, MAIN), thread_states=("T", "T"))
    found = judge(samples((stopped,), (stopped,), (stopped,)))
    assert found.finding is Finding.ELSEWHERE and "stopped by a signal" in found.why
    traced = replace(proc(1, LOCK, MAIN), thread_states=("t", "S"))
    assert judge(samples((traced,), (traced,), (traced,))).finding is Finding.HUNG
