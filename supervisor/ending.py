"""The end of a run as classify -> decide -> outcome: one pure function, applied by the daemon in one place.

:func:`conclude` takes everything known about a dead run (:class:`RunFacts`) and the
counters kept between runs, and returns an :class:`Outcome`: the verdict and its reason,
the ``exit`` record's fields, what follows (restart and when, fatal, done), the alerts to
send, whether to clear the owned caches, and the records to write after the exit.  No
clock, no I/O: the jitter is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashd.supervisor.alerts import alert_decision
from dflashd.supervisor.config import RestartConfig
from dflashd.supervisor.elastic import worker_exit_code
from dflashd.supervisor.events import Event
from dflashd.supervisor.lifecycle import State
from dflashd.supervisor.policy import Action, Decision, RestartHistory, decide
from dflashd.supervisor.verdicts import (
    AlertKind,
    Classification,
    Observations,
    Verdict,
    classify,
    signal_name,
)

EXIT_FATAL = 4  # the daemon gave up (fatal); systemd's RestartPreventExitStatus names it


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What is known about a run when it has ended."""

    run_no: int
    obs: Observations
    duration_s: float
    first_step_after_s: float | None = None
    progress_s: float = 0.0
    step: int | None = None
    epoch: float | None = None
    tail: tuple[str, ...] = ()
    already_alerted: frozenset[AlertKind] = frozenset()
    stop_requested: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the daemon does about an ended run."""

    result: Classification
    exit_fields: dict[str, Any]
    decision: Decision
    next_state: State
    alerts: tuple[tuple[AlertKind, str], ...] = ()
    records: tuple[tuple[Event, dict[str, Any]], ...] = ()
    daemon_exit_code: int | None = None  # set when the daemon ends (done or fatal)
    restart_delay_s: float | None = None
    clear_cache: bool = False
    counts_as_restart: bool = False
    fatal_reason: str | None = None
    recovering_from: str | None = field(default=None)


def exit_fields(facts: RunFacts, result: Classification) -> dict[str, Any]:
    """The ``exit`` record of docs/design.md."""
    obs = facts.obs
    out: dict[str, Any] = {
        "exit_code": obs.exit_code,
        "signal": signal_name(obs.signal) if obs.signal is not None else None,
        "duration_s": round(facts.duration_s, 3),
        "verdict": result.verdict.value,
        "reason": result.reason,
        "tail": list(facts.tail),
        "step": facts.step,
        "output_lines": obs.output_lines,
    }
    if obs.output_lines == 0 and obs.spawn_error is None:
        out["note"] = "exited before writing anything"
    if facts.epoch is not None:
        out["epoch"] = facts.epoch
    if facts.first_step_after_s is not None:
        out["first_step_after_s"] = round(facts.first_step_after_s, 3)
    if obs.gpu_xids:
        out["gpu_xids"] = list(obs.gpu_xids)
    if obs.spawn_error is not None:
        out["error"] = obs.spawn_error
    return out


def conclude(
    facts: RunFacts,
    *,
    history: RestartHistory,
    policy: RestartConfig,
    alerts_on: tuple[AlertKind, ...],
    jitter: float,
) -> Outcome:
    """Classify the run, decide what follows, and say which alerts and records that means."""
    result = classify(facts.obs, policy.early_death_s)
    fields = exit_fields(facts, result)
    worker_code = worker_exit_code(facts.tail)  # a torchrun job: its first failed worker's code
    if worker_code is not None:
        fields["worker_exit_code"] = worker_code
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
    )
    alerted = set(facts.already_alerted)
    alerts: list[tuple[AlertKind, str]] = []

    def maybe_alert(kind: AlertKind, reason: str, early_before: int) -> None:
        if alert_decision(
            kind,
            on=alerts_on,
            already_alerted=frozenset(alerted),
            early_deaths_before=early_before,
        ):
            alerted.add(kind)
            alerts.append((kind, reason))

    maybe_alert(AlertKind(result.verdict.value), result.reason, history.early_deaths)
    recovering = "stalled" if result.verdict is Verdict.STALLED else None
    verdict = result.verdict.value
    if facts.stop_requested:
        return Outcome(result, fields, decision, State.STOPPED, tuple(alerts), daemon_exit_code=0)
    if decision.action is Action.DONE:
        records = ((Event.DONE, {"verdict": verdict}),)
        done = State.COMPLETED if result.verdict is Verdict.COMPLETED else State.STOPPED
        return Outcome(result, fields, decision, done, tuple(alerts), records, daemon_exit_code=0)
    if decision.action is Action.FATAL:
        maybe_alert(AlertKind.FATAL, decision.reason, 0)
        records = ((Event.FATAL, {"reason": decision.reason, "verdict": verdict}),)
        return Outcome(
            result,
            fields,
            decision,
            State.FATAL,
            tuple(alerts),
            records,
            daemon_exit_code=EXIT_FATAL,
            fatal_reason=decision.reason,
        )
    restart = {
        "delay_s": round(decision.delay_s, 3),
        "cache_cleared": decision.clear_cache,
        "verdict": verdict,
        "early_deaths": decision.history.early_deaths,
        "runtime_crashes": decision.history.runtime_crashes,
    }
    return Outcome(
        result,
        fields,
        decision,
        State.BACKOFF,
        tuple(alerts),
        ((Event.RESTART, restart),),
        restart_delay_s=decision.delay_s,
        clear_cache=decision.clear_cache,
        counts_as_restart=True,
        recovering_from=recovering,
    )
