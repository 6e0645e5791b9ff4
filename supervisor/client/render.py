"""Human output: status summaries, log lines, durations as "3m12s ago"; colour only on a TTY."""

from __future__ import annotations

import os
import time
from typing import Any, Final, TextIO

import click

from dflashd.logs.records import EventRecord, LineRecord, Record
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import goodput_line, view_from_json
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.rules import rule_named
from dflashd.supervisor.model.verdicts import Verdict
from dflashd.supervisor.speak.echo import escape_controls, escaped_values
from dflashd.supervisor.speak.fieldtext import recovery_line, value_text

_STYLES: Final[dict[str, dict[str, Any]]] = {
    "red": {"fg": "red"},
    "green": {"fg": "green"},
    "yellow": {"fg": "yellow"},
    "blue": {"fg": "blue"},
    "magenta": {"fg": "magenta"},
    "cyan": {"fg": "cyan"},
    "dim": {"dim": True},
    "bold": {"bold": True},
}
# Keyed by the daemon's own vocabulary (a StrEnum member hashes as its value: a state or
# verdict read from JSON finds its colour); every state has one, a verdict not named is red.
STATE_COLOR: Final[dict[str, str]] = {
    State.RUNNING: "green",
    State.COMPLETED: "green",
    State.STARTING: "cyan",
    State.BACKOFF: "yellow",
    State.FATAL: "red",
    State.STOPPING: "yellow",
    State.STOPPED: "dim",
}
_VERDICT_COLOR: Final[dict[str, str]] = {
    Verdict.COMPLETED: "green",
    Verdict.STOPPED: "dim",
    Verdict.CRASHED: "red",
    Verdict.STALLED: "yellow",
    Verdict.RENDEZVOUS_TIMEOUT: "yellow",
}
_ENDED_WELL: Final = frozenset({Verdict.COMPLETED, Verdict.STOPPED})


def verdict_colour(verdict: str) -> str:
    """A verdict's terminal colour: a rule's own (model/rules.py), red for one not named."""
    rule = rule_named(verdict)
    return _VERDICT_COLOR.get(verdict, rule.colour if rule is not None else "red")


def use_color(stream: TextIO) -> bool:
    """Colours only on a terminal, and never when NO_COLOR is set."""
    return "NO_COLOR" not in os.environ and stream.isatty()


class Painter:
    """Wraps text in colours (``click.style``) when enabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, color: str | None) -> str:
        if not self.enabled or color is None:
            return text
        return click.style(text, **_STYLES[color])


def duration(seconds: float | None) -> str:
    """``850ms``, ``42s``, ``3m12s``, ``2h05m``, ``3d04h``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def ago(epoch_s: float | None, now: float | None = None) -> str:
    """``3m12s ago``."""
    if epoch_s is None:
        return "-"
    return f"{duration(max(0.0, (now or time.time()) - epoch_s))} ago"


def _mib(value: Any) -> str:
    return "?" if value is None else f"{float(value):,.0f}"


def format_status(status: dict[str, Any], *, running: bool, paint: Painter) -> str:
    """The readable ``dflashd status``: aligned label/value rows.  Every string of the state
    is shown escaped (a home path, a command, a job's line: another user or the job shaped
    them), before any colour is added."""
    escaped = escaped_values(status)
    assert isinstance(escaped, dict)
    status = escaped
    rows: list[tuple[str, str]] = []
    state = str(status.get("state", "unknown"))
    daemon = f"{paint(state, STATE_COLOR.get(state))}"
    daemon += (
        f"   pid {status.get('pid')}"
        if running
        else paint("   (daemon not running; last known state)", "dim")
    )
    if status.get("uptime_s") is not None and running:
        daemon += f"   up {duration(status['uptime_s'])}"
    rows.append(("dflashd", daemon))
    if status.get("state_note"):  # a daemon that holds the home but does not answer, say
        rows.append(("note", paint(escape_controls(str(status["state_note"])), "yellow")))
    if status.get("fatal_reason"):
        rows.append(("fatal", paint(str(status["fatal_reason"]), "red")))
    if status.get("command"):
        rows.append(("command", escape_controls(" ".join(map(str, status["command"])))[:160]))
    if status.get("cwd"):
        rows.append(("cwd", escape_controls(str(status["cwd"]))[:160]))
    run = status.get("run")
    if run is not None:
        child = f"   pid {status['child_pid']}" if status.get("child_pid") else ""
        line = f"{run}{child}   phase {status.get('phase') or '-'}"
        step = status.get("step")
        if step is not None:
            line += f"   step {step:,}"
            if status.get("step_source"):
                line += f" ({status['step_source']})"
        line += _loss_text(status)
        age = status.get("last_progress_age_s")
        if age is not None and running:
            line += f"   progress {duration(age)} ago"
        rows.append(("run", line))
        if status.get("first_step_source"):
            rows.append(("first step", f"seen from {status['first_step_source']}"))
    waiting = status.get("waiting")
    if isinstance(waiting, dict) and running:
        since = waiting.get("since")
        held = (
            f" (for {duration(status['updated_at'] - since)})" if isinstance(since, float) else ""
        )
        text = escape_controls(str(waiting.get("on")))[:300] + held
        rows.append(("waiting", paint(text, "yellow")))
        for lock in waiting.get("stale_build_locks") or []:
            age = duration(float(lock.get("age_s") or 0.0))
            rows.append(
                ("stale lock", escape_controls(f"{lock.get('path')} (last written {age} ago)"))
            )
        if waiting.get("hint"):
            rows.append(("", escape_controls(str(waiting["hint"]))))
    rows += _pace_rows(status, running, paint)
    if status.get("child_status"):
        rows.append(("child says", escape_controls(str(status["child_status"]))))
    if status.get("last_line"):
        rows.append(("last line", paint(escape_controls(str(status["last_line"]))[:160], "dim")))
    if status.get("restart_held_until") and running:
        rows.append(("restart", f"held until {escape_controls(str(status['restart_held_until']))}"))
    elif status.get("next_restart_in_s") is not None and running:
        rows.append(("restart", f"in {duration(status['next_restart_in_s'])}"))
    by_verdict = status.get("restarts_by_verdict") or {}
    restarts = f"{status.get('restarts') or 0}"
    if by_verdict:
        restarts += "  (" + ", ".join(f"{k} {v}" for k, v in sorted(by_verdict.items())) + ")"
    if status.get("restarts_this_daemon") is not None:
        restarts += f"   {status['restarts_this_daemon']} by this daemon"
    rows.append(("restarts", restarts))
    goodput = view_from_json(status.get("goodput"))
    if goodput is not None and goodput["wall_s"] > 0:
        rows.append(("goodput", goodput_line(goodput).removeprefix("goodput ")))
    last = status.get("last_exit")
    if last:
        verdict = str(last.get("verdict"))
        how = (
            f"exit code {last['exit_code']}"
            if last.get("exit_code") is not None
            else str(last.get("signal") or "no exit status")
        )
        if last.get("error"):  # it never ran: the OS error says why
            how = f"spawn failed: {escape_controls(str(last['error']))[:160]}"

        text = (
            f"run {last.get('run')}: {paint(verdict, verdict_colour(verdict))}"
            f" ({last.get('reason')}), {how}; it had run {duration(last.get('duration_s'))},"
            f" ended {ago(last.get('ended_at'))}"
        )
        rows.append(("last exit", text))
        stacks = last.get("stacks") if isinstance(last.get("stacks"), dict) else {}
        frames = stacks.get("top") if isinstance(stacks.get("top"), list) else []
        if last.get("reason") == "hung" and frames:  # the frames that proved it, not step lines
            for frame_line in frames[:6]:
                rows.append(("", paint("  " + escape_controls(str(frame_line)), "dim")))
            if isinstance(stacks.get("path"), str):
                rows.append(("", f"  the whole dump: cat {escape_controls(stacks['path'])}"))
        else:
            for tail_line in (last.get("tail") or [])[-5:]:
                rows.append(("", paint("  " + escape_controls(str(tail_line)), "dim")))
    if isinstance(status.get("recovery"), dict):  # the live run's relaunch, split
        rows.append(("recovery", escape_controls(recovery_line(status["recovery"]))))
    alert = status.get("last_alert")
    if isinstance(alert, dict) and alert.get("kind"):
        rows.append(("last alert", _alert_text(alert, paint)))
    gpus = status.get("gpus") or []
    rows.append(
        (
            "gpu checks",
            str(status.get("gpu_checks", "-"))
            + (f", child memory by {status['gpu_method']}" if status.get("gpu_method") else ""),
        )
    )
    if isinstance(status.get("custody"), str):  # how runs own their processes
        rows.append(("custody", escape_controls(status["custody"])))
    standby = status.get("standby")
    if isinstance(standby, dict):  # the next run's interpreter, waiting (warm_standby)
        said = "ready" if standby.get("ready") else f"not ready ({standby.get('why')})"
        size = f"{_mib(standby.get('rss_mib'))} MiB"
        rows.append(
            (
                "standby",
                f"{said}   pid {standby.get('pid')}   {size}   for run {standby.get('for_run')}",
            )
        )
    tool = status.get("stacks_tool")
    if isinstance(tool, str):  # live stack dumps (dflashd stacks): the tool, or why there is none
        rows.append(("stacks", paint(tool, "yellow") if tool.startswith("unavailable") else tool))
    if status.get("log_codec") == "python":  # the C inner loops were not built: a slower log path
        rows.append(
            (
                "log codec",
                paint("python (no C build: about 40 % of the log throughput)", "yellow"),
            )
        )
    for gpu in gpus:
        util = gpu.get("utilization_pct")
        text = (
            f"{gpu.get('index')}: {_mib(gpu.get('memory_used_mib'))} / {_mib(gpu.get('memory_total_mib'))} MiB"
            f"   util {'?' if util is None else f'{util:.0f}%'}"
            f"   child {_mib(gpu.get('child_memory_mib'))} MiB"
        )
        if gpu.get("error"):
            text += "   " + paint(str(gpu["error"]), "red")
        rows.append(("gpu", text))
    stats = status.get("log_stats") or {}
    log_line = str(status.get("log", "-"))
    if stats.get("records_dropped"):
        log_line += paint(
            f"   {stats['records_dropped']} records dropped ({stats.get('last_error')})", "red"
        )
    rows.append(("log", log_line))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{paint(label.ljust(width), 'bold')}  {value}" for label, value in rows)


def _alert_text(alert: dict[str, Any], paint: Painter) -> str:
    """``stalled (hung) run 2, 3m ago: webhook ok, command FAILED (exit code 1)``."""
    text = f"{alert.get('kind')} ({alert.get('reason')}) run {alert.get('run')}"
    at = alert.get("at")
    if isinstance(at, int | float):
        text += f", {ago(at)}"
    said = []
    for sink, took in sorted((alert.get("sinks") or {}).items()):
        if not isinstance(took, dict):
            said.append(f"{sink} " + paint("sending", "yellow"))
        elif took.get("ok"):
            said.append(f"{sink} ok")
        else:
            detail = escape_controls(str(took.get("detail") or ""))[:120]
            said.append(f"{sink} " + paint(f"FAILED ({detail})", "red"))
    return text + (": " + ", ".join(said) if said else "")


def format_record(
    record: Record, paint: Painter, *, escape: bool = True, dated: bool = False, bar: bool = False
) -> str:
    """One log record as a readable line: time (UTC; ``dated``: with the date), run, source,
    then the text or the event.

    With ``escape`` (the default), control characters from the job are shown escaped, so a
    job's escape sequences cannot retitle, clear or reprogram the reader's terminal.
    """
    clean = escape_controls if escape else _same
    ts = f"{record.ts[:10]} {record.ts[11:23]}" if dated else record.ts[11:23]
    prefix = paint(f"{ts} r{record.run}", "dim")
    if isinstance(record, LineRecord):
        if bar or record.eol == "\r":  # a progress bar: neither an error nor a line of its own
            src = paint("bar", "dim")
        else:
            src = paint("err", "red") if record.src == "stderr" else paint("out", "dim")
        suffix = paint(" …", "dim") if record.partial else ""
        return f"{prefix} {src} {clean(record.line)}{suffix}"
    assert isinstance(record, EventRecord)
    fields = " ".join(
        f"{k}={clean(value_text(v))}"
        for k, v in record.fields.items()
        if k not in ("tail", "traceback")
    )
    color = (
        "red"
        if record.event in (Event.EXIT, Event.FATAL)
        and record.fields.get("verdict") not in _ENDED_WELL
        else "cyan"
    )
    text = f"{prefix} {paint('dflashd', 'magenta')} {paint(record.event, color)} {fields}".rstrip()
    tail = record.fields.get("tail")
    if record.event == Event.EXIT and isinstance(tail, list) and tail:
        text += "\n" + "\n".join(paint("    | " + clean(str(line)), "dim") for line in tail[-10:])
    return text


def _same(text: str) -> str:
    return text


def _pace_rows(status: dict[str, Any], running: bool, paint: Painter) -> list[tuple[str, str]]:
    """The run's pace against its own baseline, an open slowdown, a diverged loss."""
    rows: list[tuple[str, str]] = []
    pace = status.get("pace")
    if isinstance(pace, dict) and running and pace.get("baseline_step_s"):
        line = f"{float(pace['baseline_step_s']) * 1000:.1f} ms/step baseline"
        if pace.get("recent_step_s") is not None:
            line += f", {float(pace['recent_step_s']) * 1000:.1f} ms/step now"
        rows.append(("pace", line))
    slow = status.get("slow")
    if isinstance(slow, dict):
        causes = "; ".join(escape_controls(str(c)) for c in slow.get("causes") or [])
        text = f"{float(slow.get('ratio') or 0):.2f}x its own step time: {causes}"
        straggler = slow.get("straggler")
        if isinstance(straggler, dict) and straggler.get("where"):
            text += f"; straggler: {escape_controls(str(straggler['where']))}"
        rows.append(("slow", paint(text[:400], "yellow")))
    diverged = status.get("diverged")
    if isinstance(diverged, dict):
        text = (
            f"at step {diverged.get('step')} (last good step {diverged.get('last_good_step')}): "
            f"{escape_controls(str(diverged.get('why')))}"
        )
        rows.append(("diverged", paint(text[:400], "red")))
    advice = status.get("checkpoint_advice")
    if isinstance(advice, dict) and advice.get("text"):
        rows.append(("checkpoints", escape_controls(str(advice["text"]))[:300]))
    return rows


def _loss_text(status: dict[str, Any]) -> str:
    """``   loss 0.201``, or ``   loss nan (last finite 0.201 at step 59)`` once the newest
    loss is not a number: the finite one is never shown as if it were the newest."""
    loss, bad = status.get("loss"), status.get("loss_unfinite")
    if isinstance(bad, str):
        if not isinstance(loss, int | float):
            return f"   loss {escape_controls(bad)}"
        where = f" at step {status['loss_step']}" if status.get("loss_step") is not None else ""
        return f"   loss {escape_controls(bad)} (last finite {loss:.4g}{where})"
    return f"   loss {loss:.4g}" if isinstance(loss, int | float) else ""
