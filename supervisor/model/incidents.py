"""Incidents: a failure a person hears about once, and the step that ends it (pure).

A run ends stalled at step 3 and is alerted: that opens an incident.  Its relaunch stalling
again before passing step 3 is the same incident, not a new page; the ``fatal`` that ends a
loop of them is (:func:`repeats`).  The incident ends when a run passes the step its failures
reached (:func:`passed`): after a stall or a fatal, that is the ``recovered`` alert
(:func:`resumed`); after other failures it closes quietly, and the next failure pages again.
Whether a verdict pages at all is :func:`alert_decision` (the config's ``alerts.on``, one
alert per verdict per run, a crash loop's repeated early deaths quiet); delivery is
:mod:`alerts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflashd.supervisor.model.effects import Effect, Incident, SendAlert, UpdateLedger
from dflashd.supervisor.model.verdicts import EARLY_DEATH_NAMES, AlertKind, Notice


def alert_decision(
    kind: AlertKind,
    *,
    on: tuple[AlertKind, ...],
    already_alerted: frozenset[AlertKind],
    early_deaths_before: int,
) -> bool:
    """Whether to alert: one alert per verdict per run, for the verdicts in ``alerts.on``.

    A crash loop alerts on its first early death and on the ``fatal``, not on every
    attempt: an early death that follows another early death stays quiet.
    """
    if kind not in on or kind in already_alerted:
        return False
    return not (kind.value in EARLY_DEATH_NAMES and early_deaths_before > 0)


def repeats(incident: Incident | None, kind: AlertKind) -> bool:
    """A failure of the open incident's kind: one more of the same, no new alert."""
    return incident is not None and kind is not Notice.FATAL and incident.kind == kind.value


def extended(incident: Incident | None, verdict: str, step: int | None) -> Incident:
    """The incident after a failure ``verdict`` at ``step``: the furthest step of its kind."""
    if incident is not None and incident.kind == verdict:
        steps = [s for s in (incident.step, step) if s is not None]
        step = max(steps) if steps else None
    return Incident(verdict, step)


def passed(incident: Incident | None, step: int | None) -> bool:
    """A run's progress at ``step`` ends the incident (any first step when it has no step)."""
    if incident is None:
        return False
    return incident.step is None or (step is not None and step > incident.step)


def recovered_reason(
    recovering_from: str, last_exit: Mapping[str, Any] | None, step: int | None
) -> tuple[str, dict[str, Any]]:
    """What a ``recovered`` alert says it recovered from: the failure's kind, the run that
    failed, its verdict, reason and step (from the ledger's last exit), and where training
    is now; and the same as fields."""
    said: dict[str, Any] = {"kind": recovering_from}
    if last_exit:
        for key in ("run", "verdict", "reason", "step"):
            if last_exit.get(key) is not None:
                said[key] = last_exit[key]
    what = recovering_from
    if said.get("run") is not None:
        what += f": run {said['run']} {said.get('verdict', '')} ({said.get('reason', '?')})"
        if said.get("step") is not None:
            what += f" at step {said['step']}"
    now = f"; training is at step {step}" if step is not None else ""
    return f"recovered from {what}{now}", said


def resumed(
    recovering_from: str | None,
    *,
    alerts_on: tuple[AlertKind, ...],
    already_alerted: frozenset[AlertKind],
    last_exit: Mapping[str, Any] | None = None,
    step: int | None = None,
) -> tuple[Effect, ...]:
    """Training passed the failure: the ``recovered`` alert after a stall or a fatal (if on),
    saying what it recovered from, and the incident closed."""
    effects: list[Effect] = []
    if recovering_from is not None and alert_decision(
        Notice.RECOVERED, on=alerts_on, already_alerted=already_alerted, early_deaths_before=0
    ):
        reason, said = recovered_reason(recovering_from, last_exit, step)
        effects.append(SendAlert(Notice.RECOVERED, reason, {"tail": [], "recovered_from": said}))
    effects.append(UpdateLedger(recovered=True))
    return tuple(effects)
