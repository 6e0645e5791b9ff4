"""What the live run's evidence means, as histories through the one reducer (issue 52).

Each test hands :func:`~dflashd.supervisor.model.step.step` the evidence as the shell reads it
(``LinesSeen`` as the drain thread's watcher posts it, ``NotifyRead``, ``GpuSeen``, the host's
answers ``SlowCauses`` and ``SlowStacks``, a ``StallLook``, ``Reaped``) and reads what the
model decides: the run's next facts, its records and alerts, what it asks of the host.  No
process, pipe or clock: the adapters that read these are pinned by the real-process suites.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from dflashd.supervisor.model.agent import AgentLine, AgentSaid, AgentView, TorchrunJob
from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    KeepPaceBaseline,
    LookForSlowCauses,
    PrepareStandby,
    Publish,
    SendAlert,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpuuse import ChildGpuUse
from dflashd.supervisor.model.inputs import (
    GpuSeen,
    Input,
    Launched,
    LinesSeen,
    NotifyRead,
    Reaped,
    SlowCauses,
    SlowStacks,
    StallLook,
)
from dflashd.supervisor.model.ledger import Incident, Ledger
from dflashd.supervisor.model.progress import LineProgress, NotifyMessage
from dflashd.supervisor.model.step import DaemonState, Rules, step
from dflashd.supervisor.model.verdicts import EndedBy, Notice, Verdict
from tests.tables import play, run_state

JOB = TorchrunJob(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="node0:29400", rdzv_id="j1")


def launched(*, agent: bool = False, ledger: Ledger | None = None, **rules: object) -> DaemonState:
    """A daemon whose run 1 was launched at 0 (a torchrun agent's, with ``agent``)."""
    facts = run_state(0.0)
    if agent:
        progress = replace(facts.progress, rendezvous=True)
        facts = replace(facts, agent=AgentView(JOB, rendezvous_since=0.0), progress=progress)
    state = DaemonState(rules=Rules(**rules), ledger=ledger or Ledger())  # type: ignore[arg-type]
    return step(state, Launched(facts), 0.0)[0]


def records(effects: Sequence[Effect]) -> list[str]:
    return [e.event.value for e in effects if isinstance(e, WriteRecord)]


def line(step_no: int, *, first: bool = False, loss: float | None = None) -> LinesSeen:
    return LinesSeen(1, LineProgress(step_no, first, "pattern", loss=loss), f"step {step_no}")


def test_the_first_step_is_recorded_once_and_the_standby_prepared() -> None:
    state, said = play(
        launched(),
        [(1.0, LinesSeen(1, None, "loading")), (30.0, line(1, first=True)), (31.0, line(2))],
    )
    assert said[0] == [] and state.run is not None
    assert records(said[1])[:1] == ["first_step"] and PrepareStandby() in said[1]
    first = next(e for e in said[1] if isinstance(e, WriteRecord))
    assert first.fields == {"after_s": 30.0, "step": 1, "source": "pattern"}
    assert "first_step" not in records(said[2])
    assert state.run.progress.step == 2 and state.run.progress.last_line == "step 2"


def test_bare_output_is_liveness_and_a_long_last_line_is_cut() -> None:
    state, said = play(launched(), [(5.0, LinesSeen(1, None, "x" * 2000))])
    assert said == [[]] and state.run is not None
    assert (
        state.run.progress.last_alive_mono == 5.0 and len(state.run.progress.last_line or "") == 500
    )


def test_a_reaped_runs_curve_ends_where_it_did_then_its_exit_is_concluded() -> None:
    end = Reaped(1, None, 11, died_mono=90.0, ended_at=1090.0, tails={"stderr": ("Segfault",)})
    state, said = play(
        launched(), [(1.0, line(1, first=True)), (1.5, line(7, loss=2.5)), (90.0, end)]
    )
    assert records(said[2])[:2] == ["progress", "exit"]  # the last point, then the end
    last, exit_record = [e for e in said[2] if isinstance(e, WriteRecord)][:2]
    assert last.fields["step"] == 7 and last.fields["loss"] == 2.5
    assert exit_record.fields["verdict"] == "crashed" and exit_record.fields["signal"] == "SIGSEGV"
    assert state.ledger.restarts_by_verdict == {"crashed": 1}


def test_how_long_a_silent_run_lived_tells_an_early_death_from_a_crash() -> None:
    """No first step: its last sign of life is what it lived (model/died.py), unless it kept a
    tenth of a CPU busy over its whole life (a silent CPU-bound job lived all of it)."""
    quiet = Reaped(1, 1, None, died_mono=600.0, ended_at=1600.0, cpu_s=1.0, output_lines=3)
    busy = replace(quiet, cpu_s=300.0)
    for reaped, verdict in ((quiet, "crash_before_first_step"), (busy, "crashed")):
        _, said = play(launched(), [(5.0, LinesSeen(1, None, "loading")), (600.0, reaped)])
        exit_record = next(
            e for e in said[1] if isinstance(e, WriteRecord) and e.event is Event.EXIT
        )
        assert exit_record.fields["verdict"] == verdict, exit_record.fields
    assert play(launched(), [(9.0, replace(quiet, run_no=2))])[1] == [[]]  # not the current run


def test_a_worker_failure_and_torchruns_restart_are_said_counted_and_cost_goodput() -> None:
    failed = AgentLine(AgentSaid.WORKER_FAILED, {"exit_code": -9, "local_rank": 0, "pid": 7})
    restart = AgentLine(
        AgentSaid.GROUP_RESTART, {"state": "FAILED", "attempts_left": 2, "max_restarts": 3}
    )
    state, said = play(
        launched(agent=True),
        [
            (10.0, line(1, first=True)),
            (20.0, line(5)),
            (21.0, LinesSeen(1, None, "boom", (failed, restart))),
        ],
    )
    assert records(said[2]) == ["worker_failed", "workers_restarted"]
    assert state.ledger.agent_restarts == 1 and state.ledger.agent_worker_failures == 1
    assert state.run is not None and state.run.agent is not None
    assert (state.run.agent.worker_failures, state.run.agent.group_restarts) == (1, 1)
    assert state.run.progress.recoveries and state.run.progress.recoveries[-1].failed == 21.0


def test_the_rendezvous_completes_with_the_world_the_agent_printed() -> None:
    done = (AgentLine(AgentSaid.RENDEZVOUS_DONE), AgentLine(AgentSaid.WORLD, {"group_rank": 1}))
    world = AgentLine(AgentSaid.WORLD, {"group_world_size": 2})
    state, said = play(launched(agent=True), [(40.0, LinesSeen(1, None, "rdzv", (*done, world)))])
    assert said[0] == [
        WriteRecord(Event.RENDEZVOUS, {"state": "complete", "group_rank": 1, "group_world_size": 2})
    ]
    assert state.run is not None and state.run.agent is not None
    assert state.run.agent.rendezvous == "complete" and not state.run.progress.rendezvous


def test_a_workers_datagram_ends_the_rendezvous_the_agent_kept_quiet_about() -> None:
    heard = NotifyRead(1, NotifyMessage(status="warming up", sender_pid=4242), worker=True)
    state, said = play(launched(agent=True), [(50.0, heard)])
    assert records(said[0]) == ["rendezvous", "child_status"]
    assert said[0][0] == WriteRecord(
        Event.RENDEZVOUS,
        {
            "state": "complete",
            "evidence": "workers_running",
            "group_rank": None,
            "group_world_size": None,
        },
    )
    assert state.run is not None and 4242 in state.run.pids_seen


def test_a_stall_look_at_an_agent_whose_workers_run_is_not_a_stall() -> None:
    state, said = play(launched(agent=True), [(400.0, StallLook(1, False, None, workers_run=True))])
    assert records(said[0]) == ["rendezvous"] and state.run is not None
    assert state.run.ended_by is EndedBy.CHILD and not state.run.progress.rendezvous
    # the same look at a run with no sign of life: stalled, through the stall decider
    state, said = play(launched(), [(400.0, StallLook(1, False, None))])
    assert state.run is not None and state.run.ended_by is EndedBy.NO_PROGRESS


def steady(
    state: DaemonState, start: float, steps: range, every: float
) -> tuple[DaemonState, list[list[Effect]]]:
    return play(state, [(start + i * every, line(n, first=n == 1)) for i, n in enumerate(steps)])


def test_a_slowdown_asks_the_host_why_then_says_it_dumps_and_recovers() -> None:
    state, said = steady(launched(), 1.0, range(1, 33), 1.0)  # warm-up, then the baseline
    flat = [e for s in said for e in s]
    assert KeepPaceBaseline() in flat and "pace" in records(flat)
    state, said = steady(state, 33.0, range(33, 70), 2.0)  # twice as slow, for over 20 s
    asked = [e for s in said for e in s if isinstance(e, LookForSlowCauses)]
    assert len(asked) == 1 and asked[0].ratio is not None and asked[0].ratio >= 1.2
    assert state.run is not None and state.run.slow is None  # said once the host answered
    state, said = play(state, [(110.0, SlowCauses(1, ("another process on GPU 0",)))])
    assert records(said[0]) == ["slow"] and DumpStacks("slow", "1-1") in said[0]
    alert = next(e for e in said[0] if isinstance(e, SendAlert))
    assert alert.kind is Notice.SLOW and "another process on GPU 0" in alert.reason
    assert state.run is not None and state.run.slow is not None
    state, said = steady(state, 111.0, range(70, 100), 1.0)  # back to its pace
    flat = [e for s in said for e in s]
    assert "slow_over" in records(flat) and any(
        isinstance(e, SendAlert) and e.kind is Notice.RECOVERED for e in flat
    )
    assert state.run is not None and state.run.slow is None


def test_the_stacks_at_a_slowdown_name_the_straggler_or_look_again() -> None:
    state = launched()
    assert state.run is not None
    state = replace(state, run=replace(state.run, slow={"ratio": 2.0}))
    said = WriteRecord(Event.STACKS, {"dump_id": "1-1"})
    ranks = {"processes": [{"rank": 0}, {"rank": 1}]}
    state, out = play(
        state,
        [
            (1.0, SlowStacks(1, said, ranks)),
            (2.0, SlowStacks(1, said, ranks)),
            (3.0, SlowStacks(1, said, ranks)),
        ],
    )
    assert [
        kinds.count(DumpStacks("slow", "1-1")) + kinds.count(DumpStacks("slow", "1-2"))
        for kinds in out
    ] == [1, 1, 0]
    odd = {**ranks, "odd_rank_out": [1], "odd_summary": "rank 1 in all_reduce"}
    state, out = play(state, [(4.0, SlowStacks(1, said, odd))])
    assert records(out[0]) == ["stacks", "slow_cause"]
    assert state.run is not None and state.run.slow is not None
    assert state.run.slow["straggler"] == {"straggler_ranks": [1], "where": "rank 1 in all_reduce"}


def test_a_diverged_loss_alerts_with_the_jobs_last_lines_and_is_kept() -> None:
    history: list[tuple[float, Input]] = [
        (float(n), line(n, first=n == 1, loss=2.0 - n / 100)) for n in range(1, 4)
    ]
    tail = ("step 4 loss nan", "step 5 loss nan", "step 6 loss nan")
    history += [(float(n), replace(line(n, loss=float("nan")), tail=tail)) for n in range(4, 7)]
    state, said = play(launched(), history)
    flat = [e for s in said for e in s]
    assert records(flat).count("diverged") == 1
    alert = next(e for e in flat if isinstance(e, SendAlert))
    assert (
        alert.kind is Verdict.DIVERGED
        and alert.fields["tail"] == list(tail)
        and alert.fields["then"] == "alert"
    )
    assert state.run is not None and state.run.ended_by is EndedBy.CHILD  # alert only
    assert state.ledger.diverged_at == 4


def test_a_relaunch_diverging_at_the_same_step_again_is_ended() -> None:
    history: list[tuple[float, Input]] = [
        (float(n), line(n, first=n == 1, loss=2.0)) for n in range(1, 4)
    ]
    history += [(float(n), line(n, loss=float("nan"))) for n in range(4, 7)]
    state, said = play(launched(ledger=Ledger(diverged_at=5)), history)
    flat = [e for s in said for e in s]
    diverged = next(e for e in flat if isinstance(e, WriteRecord) and e.event is Event.DIVERGED)
    assert diverged.fields["then"] == "stop" and diverged.fields["again_at_step"] == 5
    assert state.run is not None and state.run.ended_by is EndedBy.DIVERGED


def test_training_past_a_stalls_step_closes_it_with_the_recovered_alert() -> None:
    ledger = Ledger(incident=Incident("stalled", 10), recovering_from="stalled")
    state, said = play(
        launched(ledger=ledger), [(1.0, line(9, first=True)), (2.0, line(10)), (3.0, line(11))]
    )
    assert not any(isinstance(e, SendAlert) for e in said[0] + said[1])
    alert = next(e for e in said[2] if isinstance(e, SendAlert))
    assert alert.kind is Notice.RECOVERED and Publish() in said[2]
    assert state.ledger.recovering_from is None and state.ledger.incident is None  # closed


def test_gpu_activity_is_liveness_and_a_long_busy_spell_the_first_step() -> None:
    held = ChildGpuUse({0: 30_000.0})
    record = WriteRecord(Event.GPU, {"gpus": []})
    state, said = play(
        launched(),
        [
            (
                5.0,
                GpuSeen(1, (record,), held=held, tree=frozenset({77}), active=True, power_w=300.0),
            ),
            (40.0, GpuSeen(1, (), held=held, active=True, busy=True, xids=(79,))),
        ],
    )
    assert said[0] == [record]
    assert records(said[1])[:1] == ["first_step"]
    assert state.run is not None and state.run.progress.first_step_source == "gpu"
    assert state.run.gpu_use == held and state.run.gpu_xids == (79,) and 77 in state.run.pids_seen
    assert state.run.gpu_seen == "busy"


def test_a_steady_job_with_checkpoint_pauses_learns_its_pace_and_raises_nothing() -> None:
    """Steps posted four times a second, 25 at a time, a 1.5 s pause every 200 steps (a
    checkpoint's), a loss wandering in its range: a baseline, no slowdown, no divergence."""
    history: list[tuple[float, Input]] = []
    now, step_no = 1.0, 0
    while step_no < 1400:
        step_no += 25
        now += 0.25 + (1.5 if step_no % 200 == 0 else 0.0)
        loss = 2.0 + 0.3 * math.sin(step_no / 5.0)
        history.append((now, line(step_no, first=step_no == 25, loss=loss)))
    state, said = play(launched(), history)
    flat = [e for s in said for e in s]
    assert "pace" in records(flat) and KeepPaceBaseline() in flat
    assert not [e for e in flat if isinstance(e, LookForSlowCauses | SendAlert)]
    assert "diverged" not in records(flat) and state.run is not None and state.run.slow is None
    assert state.run.progress.pace.pauses  # the checkpoints' cost, kept for the advice


def test_what_was_read_of_a_run_no_longer_current_is_still_said_and_nothing_more() -> None:
    state = launched()
    gpu = WriteRecord(Event.GPU, {"gpus": []})
    stacks = WriteRecord(Event.STACKS, {"dump_id": "1-1"})
    odd = {"odd_rank_out": [1], "processes": [{"rank": 0}, {"rank": 1}]}
    after, said = play(
        state,
        [
            (1.0, GpuSeen(7, (gpu,), use=ChildGpuUse({0: 0.0}))),
            (2.0, SlowStacks(7, stacks, odd)),
            (3.0, LinesSeen(7, None, "x")),
        ],
    )
    assert said == [[gpu], [stacks], []] and after == state
