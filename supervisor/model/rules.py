"""The registry of rule verdicts: each a :class:`~dflashd.supervisor.model.verdicts.Rule`
of its own module, one line here (issue 52.3).

A rule reads a dead run's evidence ahead of the built-in ``crashed`` and
``crash_before_first_step``: the first that finds something names the verdict, its reason,
and what a relaunch waits for.  Everything else follows from the entry: the alert kind (in
``alerts.on`` by default when the rule says so), the names ``alerts.on`` accepts, the
metrics' alert counters, the colours of ``status`` and the report.  No clock, no I/O.
"""

from __future__ import annotations

from typing import Final

from dflashd.supervisor.model.diskfull import DISK_FULL
from dflashd.supervisor.model.verdicts import (
    ALERT_KINDS,
    DEFAULT_ALERTS,
    AlertKind,
    AnyVerdict,
    Classification,
    Found,
    Notice,
    Observations,
    Rule,
    RuleVerdict,
    Verdict,
)

RULES: Final[tuple[Rule, ...]] = (DISK_FULL,)

# the built-in verdicts a rule may name more precisely: a death the job had of its own
READ_BY_RULES: Final = frozenset({Verdict.CRASHED, Verdict.CRASH_BEFORE_FIRST_STEP})

ALL_ALERT_KINDS: Final[tuple[AlertKind, ...]] = (*ALERT_KINDS, *(r.verdict for r in RULES))
ALERTED_BY_DEFAULT: Final[tuple[AlertKind, ...]] = (
    *DEFAULT_ALERTS,
    *(r.verdict for r in RULES if r.alert),
)


def rule_named(name: str) -> Rule | None:
    """The rule whose verdict is ``name``, if any."""
    return next((r for r in RULES if r.verdict == name), None)


def any_alert_kind(name: str) -> AlertKind:
    """The alert kind called ``name``, built in or a rule's (ValueError: there is none)."""
    for kind in ALL_ALERT_KINDS:
        if kind.value == name:
            return kind
    raise ValueError(f"no alert kind {name!r}")


def read_by_rules(
    result: Classification, obs: Observations, frames: tuple[str, ...]
) -> tuple[Classification, Found | None]:
    """``result`` named more precisely by the first rule that finds its evidence (a death the
    job had: see :data:`READ_BY_RULES`), with what it found; else as it was."""
    if result.verdict not in READ_BY_RULES:
        return result, None
    for rule in RULES:
        found = rule.reads(obs, frames)
        if found is not None:
            return Classification(rule.verdict, found.reason), found
    return result, None


def is_rule_verdict(verdict: AnyVerdict | Notice | str) -> bool:
    """``verdict`` is a rule's, not a built-in one."""
    return isinstance(verdict, RuleVerdict) or rule_named(str(verdict)) is not None
