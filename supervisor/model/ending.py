"""The end of a run, decided in one pure function: facts in, a list of effects out.

:func:`conclude` takes everything known about a dead run (:class:`RunFacts`) and the
counters kept between runs, and returns an :class:`Outcome`: the verdict and its reason,
and the effects, in the order the daemon carries them out (the model's ``step`` folds the
changes to its state, the one executor, :class:`~dflashd.supervisor.core.DaemonCore`, does
the rest; the effect types are in :mod:`effects`): the ``exit`` record, the runs.sqlite row, the ledger's new counters, the alerts,
the records that follow (``restart``, ``fatal``, ``done``), what becomes of the run's
processes, the loop's next state, the restart timer, the daemon's exit code.

A failure of the kind already alerted, before any run passed its step, is one more of the
same incident (:mod:`incidents`): no new alert; :func:`~dflashd.supervisor.model.incidents.resumed`
decides the other end, the ``recovered`` alert.  A run a killed daemon never saw end (``lost``) is
concluded here too, through :func:`classify`.  No clock, no I/O: time and jitter come in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dflashd.supervisor.model.effects import (
    Effect,
    EnterState,
    ExitDaemon,
    Incident,
    RecordHistory,
    RestartIn,
    SendAlert,
    SettleGoodput,
    SettleProcesses,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_FATAL, worker_exit_code
from dflashd.supervisor.model.goodput import Cost, run_cost
from dflashd.supervisor.model.incidents import alert_decision, extended, repeats
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.policy import Action, Decision, RestartConfig, RestartHistory, decide
from dflashd.supervisor.model.rules import any_alert_kind, read_by_rules
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.verdicts import (
    AlertKind,
    Classification,
    EndedBy,
    Notice,
    Observations,
    Verdict,
    classify,
    signal_name,
)

EXIT_RECORD_WAIT_S: Final = 0.1  # the exit record is waited onto disk before the bookkeeping


@dataclass(frozen=True, slots=True)
class Outcome:
    """The verdict, the policy's decision (None for a lost run) and the effects, in order."""

    result: Classification
    decision: Decision | None
    exit_fields: dict[str, Any]
    effects: tuple[Effect, ...]

    @property
    def next_state(self) -> State | None:
        """The state the loop enters (None: unchanged)."""
        states = [e.state for e in self.effects if isinstance(e, EnterState)]
        return states[-1] if states else None

    @property
    def alerts(self) -> tuple[tuple[AlertKind, str], ...]:
        """The alerts sent, as (kind, reason)."""
        return tuple((e.kind, e.reason) for e in self.effects if isinstance(e, SendAlert))

    @property
    def records(self) -> tuple[Event, ...]:
        """The records written, in order."""
        return tuple(e.event for e in self.effects if isinstance(e, WriteRecord))

    @property
    def daemon_exit_code(self) -> int | None:
        """The daemon's exit code when it ends (done or fatal), else None."""
        codes = [e.code for e in self.effects if isinstance(e, ExitDaemon)]
        return codes[-1] if codes else None

    @property
    def restart_delay_s(self) -> float | None:
        """The delay before the next launch, when one follows."""
        delays = [e.delay_s for e in self.effects if isinstance(e, RestartIn)]
        return delays[-1] if delays else None

    @property
    def book(self) -> UpdateLedger:
        """The ledger's change (every outcome has exactly one)."""
        return next(e for e in self.effects if isinstance(e, UpdateLedger))


def exit_fields(facts: RunFacts, result: Classification) -> dict[str, Any]:
    """The ``exit`` record of docs/design.md."""
    obs = facts.obs
    lost = result.verdict is Verdict.LOST
    out: dict[str, Any] = {
        "exit_code": obs.exit_code,
        "signal": signal_name(obs.signal) if obs.signal is not None else None,
        "duration_s": None if facts.duration_s is None else round(facts.duration_s, 3),
        "verdict": result.verdict.value,
        "reason": result.reason,
        "tail": list(facts.tail),
        "step": facts.step,
        "output_lines": None if lost else obs.output_lines,
    }
    if lost:
        out["note"] = "the daemon died while this run lived: its end was not seen"
    elif obs.output_lines == 0 and obs.spawn_error is None:
        out["note"] = "exited before writing anything"
    if facts.epoch is not None:
        out["epoch"] = facts.epoch
    if facts.first_step_after_s is not None:
        out["first_step_after_s"] = round(facts.first_step_after_s, 3)
    if facts.pause_s is not None:
        out["checkpoint_pause_s"] = round(facts.pause_s, 3)
    if obs.gpu_xids:
        out["gpu_xids"] = list(obs.gpu_xids)
    if obs.spawn_error is not None:
        out["error"] = obs.spawn_error
    if facts.stacks is not None:
        out["stacks"] = facts.stacks
    if facts.flight_recorder:
        out["flight_recorder"] = list(facts.flight_recorder)
    if facts.hung_after_s is not None:
        out["hung_after_s"] = facts.hung_after_s
    if facts.hang_evidence is not None:
        out["hang_evidence"] = facts.hang_evidence
    if facts.stale_build_locks:
        out["stale_build_locks"] = list(facts.stale_build_locks)
        out["stale_build_locks_hint"] = (
            "a killed build leaves its lock and torch waits on it: remove it if no build runs"
        )
    return out


def history_row(fields: dict[str, Any]) -> dict[str, Any]:
    """The runs.sqlite columns of an ``exit`` record."""
    return {
        "verdict": fields["verdict"],
        "reason": fields["reason"],
        "exit_code": fields["exit_code"],
        "signal": fields["signal"],
        "first_step_s": fields.get("first_step_after_s"),
        "last_step": fields.get("step"),
    }


def conclude(
    facts: RunFacts,
    *,
    history: RestartHistory,
    policy: RestartConfig,
    alerts_on: tuple[AlertKind, ...],
    jitter: float,
    incident: Incident | None = None,
) -> Outcome:
    """Classify the run, decide what follows, and list every effect that means, in order.

    ``incident``: the failure already alerted that no run has passed yet; one more of its
    kind alerts nobody (the ``fatal`` that ends a loop of them does)."""
    frames = top_frames(facts.stacks)
    result, found = read_by_rules(classify(facts.obs, policy.early_death_s), facts.obs, frames)
    if facts.waited_elsewhere is not None and result.verdict is Verdict.CRASHED:
        why, waited = facts.waited_elsewhere
        reason = f"{result.reason}, after waiting {waited:.0f}s on work elsewhere ({why})"
        result = Classification(result.verdict, f"{reason}: a peer on another node was lost?")
    fields = exit_fields(facts, result)
    if facts.waited_elsewhere is not None:
        fields["waited_elsewhere"] = {
            "why": facts.waited_elsewhere[0],
            "for_s": round(facts.waited_elsewhere[1], 3),
        }
    cost: Cost | None = None  # what the run cost (goodput); unknown for a run not seen end
    if facts.times is not None and facts.died_mono is not None:
        ok = result.verdict is Verdict.COMPLETED
        cost = run_cost(
            facts.times, facts.died_mono, ended=True, completed=ok, stop_at=facts.stop_at
        )
        fields["cost"] = cost.record()
    worker_code = worker_exit_code(facts.tail)  # a torchrun job: its first failed worker's code
    if worker_code is not None:
        fields["worker_exit_code"] = worker_code
    verdict = result.verdict.value
    level = "info" if result.verdict in (Verdict.COMPLETED, Verdict.STOPPED) else "error"
    written: list[Effect] = [
        WriteRecord(Event.EXIT, fields, level, EXIT_RECORD_WAIT_S),
        RecordHistory(facts.run_no, facts.ended_at, history_row(fields)),
    ]
    last_exit = {"run": facts.run_no, "ended_at": facts.ended_at, **fields}
    alerted = set(facts.already_alerted)

    def account(relaunch: bool) -> tuple[Effect, ...]:
        if cost is None or facts.died_mono is None:
            return ()
        return (SettleGoodput(cost, facts.died_mono, relaunch),)

    def alert(kind: AlertKind, reason: str, early_before: int) -> list[Effect]:
        on = not repeats(incident, kind) and alert_decision(
            kind, on=alerts_on, already_alerted=frozenset(alerted), early_deaths_before=early_before
        )
        alerted.add(kind)
        return [SendAlert(kind, reason, fields)] if on else []

    if result.verdict is Verdict.LOST:  # concluded at a later daemon's start, which relaunches
        book = UpdateLedger(last_exit=last_exit, counted_verdict=verdict)
        lost = alert(Verdict.LOST, result.reason, 0)
        return Outcome(result, None, fields, (*written, book, *lost))

    decision = decide(
        result.verdict,
        exit_code=facts.obs.exit_code,
        # A runtime crash with no step seen left its start-up all the same: runtime budget.
        reached_first_step=facts.obs.reached_first_step or result.verdict is Verdict.CRASHED,
        progress_s=facts.progress_s,
        history=history,
        policy=policy,
        jitter=jitter,
        reason=result.reason,
        worker_exit_code=worker_code,
        step=facts.step,
        tail=facts.tail,
        frames=frames,
    )
    if decision.action is Action.RESTART and facts.stale_build_locks:
        # torch would wait on the same lock again: one alert with the path, not a loop
        lock = facts.stale_build_locks[0]
        decision = replace(decision, action=Action.FATAL, reason=f"stale_build_lock:{lock}")
    settle = SettleProcesses(kill_now=facts.obs.ended_by is not EndedBy.CHILD)
    verdict_alert = any_alert_kind(verdict)
    if facts.stop_requested:
        book = UpdateLedger(last_exit=last_exit, history=decision.history, clear_cache_next=False)
        alerts = alert(verdict_alert, result.reason, history.early_deaths)
        ending = (settle, EnterState(State.STOPPED), ExitDaemon(0))
        return Outcome(
            result, decision, fields, (*written, book, *account(False), *alerts, *ending)
        )
    if decision.action is Action.DONE:
        book = UpdateLedger(last_exit=last_exit, history=decision.history, clear_cache_next=False)
        alerts = alert(verdict_alert, result.reason, history.early_deaths)
        done = State.COMPLETED if result.verdict is Verdict.COMPLETED else State.STOPPED
        after: tuple[Effect, ...] = (
            WriteRecord(Event.DONE, {"verdict": verdict}, "info"),
            settle,
            EnterState(done),
        )
        effects = (*written, book, *account(False), *alerts, *after, ExitDaemon(0))
        return Outcome(result, decision, fields, effects)
    if decision.action is Action.FATAL:
        book = UpdateLedger(
            last_exit=last_exit,
            history=decision.history,
            clear_cache_next=False,
            fatal_reason=decision.reason,
        )
        # One page for one event: the ``fatal`` alert carries the run's exit (code, tail);
        # the verdict's own alert goes out only where ``fatal`` is not alerted.
        alerts = alert(Notice.FATAL, decision.reason, 0)
        if not alerts:
            alerts = alert(verdict_alert, result.reason, history.early_deaths)
        fatal = WriteRecord(Event.FATAL, {"reason": decision.reason, "verdict": verdict}, "error")
        after = (fatal, settle, EnterState(State.FATAL), ExitDaemon(EXIT_FATAL))
        effects = (*written, book, *account(False), *alerts, *after)
        return Outcome(result, decision, fields, effects)
    book = UpdateLedger(
        last_exit=last_exit,
        history=decision.history,
        counted_verdict=verdict,
        clear_cache_next=decision.clear_cache,
        recovering_from="stalled" if result.verdict is Verdict.STALLED else None,
        incident=extended(incident, verdict, facts.step),
        hold=found.hold if found is not None else None,
    )
    alerts = alert(verdict_alert, result.reason, history.early_deaths)
    if not alerts and facts.waited_elsewhere is not None:
        # a crash right after a wait elsewhere: its peer was lost; the wait's one alert says so
        alerts = alert(Notice.WAITING, result.reason, 0)
    restart = {
        "delay_s": round(decision.delay_s, 3),
        "cache_cleared": decision.clear_cache,
        "verdict": verdict,
        "early_deaths": decision.history.early_deaths,
        "runtime_crashes": decision.history.runtime_crashes,
    }
    if found is not None and found.hold is not None:  # a rule's: the relaunch waits for it
        restart["held_until"] = found.hold.describe()
    after = (
        WriteRecord(Event.RESTART, restart, "info"),
        settle,
        EnterState(State.BACKOFF),
        RestartIn(decision.delay_s),
    )
    return Outcome(result, decision, fields, (*written, book, *account(True), *alerts, *after))


def lost_facts(run_no: int, step: int | None, ended_at: float) -> RunFacts:
    """A run the previous daemon ran when it was killed: its end was never seen."""
    obs = Observations(ended_by=EndedBy.DAEMON_DIED, status_unknown=True)
    return RunFacts(run_no, obs, None, ended_at=ended_at, step=step)


def top_frames(stacks: dict[str, Any] | None) -> tuple[str, ...]:
    """Every process's top frames in the dump taken before dflashd ended a run (evidence)."""
    top = (stacks or {}).get("top")  # a line per process: its main thread's top frames
    return tuple(line for line in top if isinstance(line, str)) if isinstance(top, list) else ()
