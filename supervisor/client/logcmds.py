"""``dflashd tail`` and ``dflashd report``: reading the run log."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, Final

import click

from dflashd.supervisor.client.common import (
    fail,
    home_option,
    parse_since,
    resolve_home,
    resolve_run,
)
from dflashd.supervisor.host.home import lock_is_held
from dflashd.supervisor.model.exitcodes import EXIT_NOT_RUNNING, EXIT_USAGE

_HOME_WAIT_POLL_S: Final = 0.2
# the job's own lines say its steps: dflashd's echo of each is noise in the text view
PER_STEP_EVENTS: Final = frozenset({"progress", "child_status", "gpu"})


@click.command()
@home_option
@click.option(
    "-n",
    "--lines",
    "lines",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Records to show.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records, across rotations.")
@click.option("--run", "which_run", default=None, help="A run number, 'current' or 'previous'.")
@click.option(
    "--src",
    type=click.Choice(["stdout", "stderr", "dflashd"]),
    default=None,
    help="Only this source.",
)
@click.option(
    "--since",
    default=None,
    help="Only records since then: 30s, 10m, 2h, 1d; journalctl's '10 min ago', today, "
    "yesterday, 04:40; or an ISO time (local time unless it ends in Z or an offset such as "
    "+02:00; tail prints times in UTC).",
)
@click.option(
    "--until",
    default=None,
    help="Only records up to then (the same forms as --since); not with -f.",
)
@click.option("--grep", "pattern", default=None, help="Only records whose text matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="Raw JSON-lines records (every one).")
@click.option(
    "--raw", is_flag=True, help="Print the job's bytes as they are (terminal escapes included)."
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also dflashd's per-step records (progress, child_status), GPU samples and every "
    "redraw of a progress bar, which the text view leaves out by default (it shows a bar's "
    "last redraw, as a terminal would).",
)
def tail(
    home: Path | None,
    lines: int,
    follow: bool,
    which_run: str | None,
    src: str | None,
    since: str | None,
    until: str | None,
    pattern: str | None,
    as_json: bool,
    raw: bool,
    show_all: bool,
) -> None:
    """Show the run log: the job's output and dflashd's events (spawn, exit, alerts, hang
    checks, restarts), across rotated files (``dflashd logs`` is the same command); the
    per-step records with --all (and always in --json).

    Control characters in the job's output (escape sequences that retitle or clear a
    terminal) are shown escaped, as journalctl does; --raw and --json keep the bytes.
    Times are UTC, with the date when the records shown span more than one day.  Files
    rotated or compressed while it reads are read once each; a set that never stops changing
    is said in one line, exit 1 (never "no records").
    """
    from dflashd.logs.logset import LogSetUnsettled
    from dflashd.logs.reader import RecordFilter, last_records
    from dflashd.logs.reader import follow as follow_records
    from dflashd.logs.records import encode
    from dflashd.supervisor.client.render import Painter, format_record, use_color

    where = resolve_home(home)
    if until is not None and follow:
        fail("--until and -f: a followed log has no end; pick one", EXIT_USAGE)
    if not where.logs.is_dir():
        if not follow:
            fail(
                f"no logs in {where.root} (has dflashd been started with this home?)",
                EXIT_NOT_RUNNING,
            )
        click.echo(f"dflashd: waiting for {where.logs} to appear (Ctrl-C to give up)", err=True)
        try:
            while not where.logs.is_dir():
                time.sleep(
                    _HOME_WAIT_POLL_S
                )  # nothing to wait on: the directory does not exist yet
        except KeyboardInterrupt:
            return
    grep: re.Pattern[str] | None = None
    if pattern is not None:
        try:
            grep = re.compile(pattern)
        except re.error as exc:
            fail(f"--grep: not a valid regex: {exc}", EXIT_USAGE)
    keep = RecordFilter(
        run=resolve_run(where, which_run),
        src=src,
        since_ts=parse_since(since) if since else None,
        until_ts=parse_since(until) if until else None,
        grep=grep,
        # text mode leaves out whitespace-only lines (a tqdm.write clearing the bar); the log,
        # --raw and --json keep every byte
        skip_blank=not (raw or as_json),
        skip_events=frozenset() if show_all or as_json else PER_STEP_EVENTS,
    )
    paint = Painter(use_color(sys.stdout))
    safe = not (raw or as_json)
    days: dict[str, Any] = {"first": None, "dated": False}  # another day shown: dates on
    redraw = follow and safe and not show_all and sys.stdout.isatty()
    bar_ends: set[int] = set()  # seqs of records that ended a bar's redraws (shown as "bar")

    def show(record: Any) -> None:
        if as_json:
            sys.stdout.write(encode(record).decode())
            return
        day = record.ts[:10]
        if days["first"] is None:
            days["first"] = day
        elif day != days["first"]:
            days["dated"] = True
        bar = record.seq in bar_ends
        text = format_record(record, paint, escape=safe, dated=days["dated"], bar=bar)
        if redraw and getattr(record, "eol", None) == "\r":
            sys.stdout.write(text + "\x1b[K\r")  # followed on a terminal: redrawn in place
        else:
            sys.stdout.write(text + "\x1b[K\n" if redraw else text + "\n")

    try:
        # A filter may read the whole set backwards: a progress bar on a terminal for big logs.
        filtered = keep.grep is not None or keep.run is not None or keep.src is not None
        with _reading_bar(where.logs) if filtered else contextlib.nullcontext() as progress:
            if raw or as_json or show_all:
                records = last_records(where.logs, lines, keep, progress=progress)
            else:  # a bar as a terminal shows it: its last redraw
                records, bar_ends = _last_shown(where.logs, lines, keep, progress)
        if records and records[0].ts[:10] != records[-1].ts[:10]:
            days["dated"] = True  # the lines span days: every time with its date
        for record in records:
            show(record)
        sys.stdout.flush()
        if not follow:
            return
        after = records[-1].seq if records else _last_seq(where.logs)
        stream = follow_records(where.logs, keep, after_seq=after, poll_s=0.1)
        with closing(stream):
            for record in stream:
                show(record)
                sys.stdout.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    except LogSetUnsettled as exc:  # never "0 records, exit 0" for a read that gave up
        sys.stdout.flush()
        fail(str(exc), 1)


def collapsed(records: list[Any]) -> tuple[list[Any], set[int]]:
    """The records as a terminal would have left them: a line a progress bar redrew (it ended
    in ``\r``) is left out when a later record of the same run and stream follows it; and the
    seqs of the records that overwrote one (a bar's last state)."""
    kept: list[Any] = []
    ends: set[int] = set()
    later: dict[tuple[int, str], Any] = {}
    for record in reversed(records):
        key = (record.run, record.src)
        if getattr(record, "eol", None) == "\r" and key in later:
            ends.add(later[key].seq)
            continue
        later[key] = record
        kept.append(record)
    return kept[::-1], ends


def _last_shown(logs: Path, lines: int, keep: Any, progress: Any) -> tuple[list[Any], set[int]]:
    """The last ``lines`` records once bars are collapsed (read further back while redraws
    fill the window; at most :data:`_MAX_LOOK_BACK` records)."""
    from dflashd.logs.reader import last_records

    want = lines
    while True:
        records = last_records(logs, want, keep, progress=progress)
        shown, ends = collapsed(records)
        if len(shown) >= lines or len(records) < want or want >= _MAX_LOOK_BACK:
            return (shown[-lines:] if lines else []), ends
        want = min(want * 4, _MAX_LOOK_BACK)


_MAX_LOOK_BACK = 200_000


def _last_seq(logs: Path) -> int:
    from dflashd.logs.reader import last_records

    last = last_records(logs, 1)
    return last[0].seq if last else 0


@contextlib.contextmanager
def _reading_bar(logs: Path) -> Iterator[Callable[[int], object] | None]:
    """A progress bar over the log's bytes on a terminal (stderr); nothing when piped."""
    from dflashd.logs.logset import log_files

    total = 0
    for path in log_files(logs):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    if not sys.stderr.isatty() or total < _BAR_MIN_BYTES:
        yield None
        return
    with click.progressbar(
        length=total, label="reading the log", file=sys.stderr, show_eta=True
    ) as bar:
        yield bar.update


_BAR_MIN_BYTES = 64 << 20  # below this, reading takes well under a second


@click.command()
@home_option
@click.option(
    "--run", "which_run", default=None, help="Only this run: a number, 'current' or 'previous'."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("dflashd-report.html"),
    show_default=True,
    help="Where to write the report: .html (a self-contained page) or .svg (the charts alone); "
    "written as a new file renamed into place, never through another user's symlink.",
)
def report(home: Path | None, which_run: str | None, output: Path) -> None:
    """A picture of the recent runs: goodput, one table of runs (each run's start, command and
    error), a timeline coloured by how each run ended, steps and loss over time, GPU memory."""
    from dflashd.logs.logset import LogSetUnsettled
    from dflashd.logs.reader import RecordFilter, read_records
    from dflashd.supervisor.client.htmlreport import render_html, summarize, svg_document
    from dflashd.supervisor.client.output import UnsafeOutput, write_output
    from dflashd.supervisor.client.reportdata import collect
    from dflashd.supervisor.speak.echo import escape_controls, escape_controls_but_lines

    if output.suffix.lower() not in (".html", ".htm", ".svg"):
        fail(
            f"--output {output}: the report is .html or .svg, not {output.suffix or 'no suffix'}",
            EXIT_USAGE,
        )
    where = resolve_home(home)
    if not where.logs.is_dir():
        fail(
            f"no logs in {where.root} (has dflashd been started with this home?)", EXIT_NOT_RUNNING
        )
    run = resolve_run(where, which_run)
    try:
        with _reading_bar(where.logs) as progress:
            keep = RecordFilter(run=run, src="dflashd")
            data = collect(read_records(where.logs, keep, progress=progress))
    except LogSetUnsettled as exc:
        fail(str(exc), 1)
    if lock_is_held(where.lock):  # a daemon runs: its newest run is live, counted up to now
        data.goodput.live_until = time.time()
    if not data.runs:
        fail("no runs in the log" + (f" for run {run}" if run is not None else ""), 1)
    text = (
        svg_document(data)
        if output.suffix == ".svg"
        else render_html(data, f"dflashd runs on {where.root}")
    )
    # the job's lines, its command and the home's path are another's text: a page read with
    # `cat` or `less -R` shows them escaped, never as a terminal's controls
    text = escape_controls_but_lines(text)
    try:  # a new file renamed into place: never written through a link (client/output.py)
        write_output(output, text.encode())
    except UnsafeOutput as exc:
        fail(str(exc), 1)
    info = summarize(data)
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(info["verdicts"].items()))
    shown = escape_controls(str(output))
    click.echo(f"{shown}: {info['runs']} runs ({verdicts}), {info['gpu_points']} GPU points")
