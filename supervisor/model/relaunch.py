"""What the pre-flight's verdict means for a relaunch, as effects (pure; the rule is
:mod:`~dflashd.supervisor.model.preflight`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dflashd.supervisor.model.effects import (
    Effect,
    EnterState,
    ExitDaemon,
    Launch,
    SendAlert,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_GPU_UNUSABLE
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.preflight import GpuHealth, Preflight
from dflashd.supervisor.model.verdicts import Notice


def relaunch_effects(
    checked: Preflight, health: Sequence[GpuHealth], launch: tuple[Effect, ...]
) -> tuple[Effect, ...]:
    """What the check means for the relaunch ``launch`` (the effects that would launch): as
    before when every GPU can work; on the others when some cannot and the config allows it
    (a record, one alert); else no relaunch: one alert for an operator, fatal, exit 75."""
    fields: dict[str, Any] = {"gpus": [h.index for h in health], "ok": checked.ok}
    if checked.notes:
        fields["notes"] = list(checked.notes)
    said: list[Effect] = [WriteRecord(Event.GPU_PREFLIGHT, fields)]
    if checked.ok:
        return (*said, *launch)
    bad = [u.said() for u in checked.unusable]
    first = checked.unusable[0]
    names = ", ".join(f"GPU {u.index} ({u.uuid or 'no UUID'})" for u in checked.unusable)
    why = f"{names}: {'; '.join(first.evidence)}; an operator: {first.operator}"
    if checked.visible is not None:
        fields = {"unusable": bad, "relaunch_on": list(checked.visible)}
        said += [
            WriteRecord(Event.GPU_UNUSABLE, fields, log_level="error"),
            SendAlert(Notice.GPU_UNUSABLE, f"relaunched without {why}", fields),
        ]
        visible = checked.visible
        narrowed = tuple(
            replace(e, visible_gpus=visible) if isinstance(e, Launch) else e for e in launch
        )
        return (*said, *narrowed)
    fields = {"unusable": bad, "exit_code": EXIT_GPU_UNUSABLE}
    return (
        *said,
        WriteRecord(Event.GPU_UNUSABLE, fields, log_level="error"),
        SendAlert(Notice.GPU_UNUSABLE, f"not relaunched: {why}", fields),
        EnterState(State.FATAL),
        ExitDaemon(EXIT_GPU_UNUSABLE),
    )
