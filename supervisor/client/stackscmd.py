"""``dflashd stacks``: where every process of the live run is, without stopping it.

The daemon dumps the run (it finds the processes: a torchrun agent and its workers
included) and writes a ``stacks`` record and a file under logs/stacks/; this command asks
for the dump over control.sock, waits for the record, and prints the file.  ``--run N`` of
a run that has ended prints the last dump taken of it (the one before dflashd killed it).
"""

from __future__ import annotations

import re
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Final

import click
import orjson

from dflashd.logs import EventRecord, RecordFilter, follow, last_records
from dflashd.logs.safejson import dumps_any
from dflashd.supervisor.client.common import fail, home_option, resolve_home, resolve_run
from dflashd.supervisor.host.home import Home, lock_is_held
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.exitcodes import EXIT_NOT_RUNNING, EXIT_USAGE
from dflashd.supervisor.speak.control import ControlError, request
from dflashd.supervisor.speak.echo import escape_controls
from dflashd.supervisor.speak.statusview import read_state

DUMP_WAIT_S: Final = 20.0  # the daemon bounds a dump to 5 s (8 processes); this is slack
_STACKS: Final = re.compile(r"^stacks ")  # the event's name leads its searchable text


@click.command()
@home_option
@click.option(
    "--native",
    is_flag=True,
    help="Add C/C++ frames (a rank stuck in cudaStreamSynchronize or an NCCL wait shows "
    "where); py-spy then pauses each process for its unwind, tens of milliseconds.",
)
@click.option("--json", "as_json", is_flag=True, help="The dump as one JSON object.")
@click.option(
    "--run",
    "which_run",
    default=None,
    help="A run that has ended (a number, 'current' or 'previous', as tail takes it): its "
    "last dump (taken before dflashd killed it).",
)
def stacks(home: Path | None, native: bool, as_json: bool, which_run: str | None) -> None:
    """Dump every Python process of the live run (all threads, named), the job still running.

    Each process is labelled: the torchrun agent, or a worker with its RANK and LOCAL_RANK.
    Where the ranks disagree, the first line names the odd rank out.  The dump is also kept
    as logs/stacks/run-N-<time>-<id>.txt and a `stacks` record.  Needs py-spy (a dependency of
    dflashd): `dflashd status` says when it is unavailable, in a container whose seccomp
    profile forbids process_vm_readv, say.
    """
    where = resolve_home(home)
    run_no = resolve_run(where, which_run)
    if run_no == 0:
        fail("--run: no run before the first", EXIT_USAGE)
    state = read_state(where.state_file) or {}
    live = lock_is_held(where.lock)
    if run_no is not None and not (live and state.get("run") == run_no):
        _print(_last_dump(where, run_no), as_json)
        return
    if not live:
        fail(f"dflashd is not running on {where.root}", EXIT_NOT_RUNNING)
    last = last_records(where.logs, 1)
    after_seq = last[0].seq if last else 0
    try:
        reply = request(where.control_socket, {"cmd": "stacks", "native": native}, timeout_s=10.0)
    except ControlError as exc:
        fail(f"cannot reach the daemon: {exc}", 1)
    if not reply.get("ok"):
        fail(f"no dump: {reply.get('error')}", 1)
    _print(_wait_for(where, str(reply.get("dump_id")), after_seq), as_json)


def _wait_for(home: Home, dump_id: str, after_seq: int) -> EventRecord:
    deadline = time.monotonic() + DUMP_WAIT_S
    records = follow(
        home.logs,
        RecordFilter(src="dflashd"),
        after_seq=after_seq,
        poll_s=0.05,
        should_stop=lambda: time.monotonic() > deadline,
    )
    with closing(records):
        for record in records:
            if (
                isinstance(record, EventRecord)
                and record.event == Event.STACKS
                and record.fields.get("dump_id") == dump_id
            ):
                return record
    fail(f"the daemon wrote no dump within {DUMP_WAIT_S:.0f} s", 1)


def _last_dump(home: Home, run_no: int) -> EventRecord:
    keep = RecordFilter(run=run_no, src="dflashd", grep=_STACKS)
    found = [r for r in last_records(home.logs, 1, keep) if isinstance(r, EventRecord)]
    if not found:
        fail(f"no stack dump of run {run_no} in {home.logs}", 1)
    return found[-1]


def _print(record: EventRecord, as_json: bool) -> None:
    fields = record.fields
    path = fields.get("path")
    if as_json:
        full: dict[str, Any] = {"run": record.run, "ts": record.ts, **fields}
        if isinstance(path, str):
            try:
                full["dump"] = orjson.loads(Path(path).with_suffix(".json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                full["dump"] = None
        click.echo(dumps_any(full).decode())
    elif isinstance(path, str) and Path(path).is_file():
        # thread and function names are the job's: escape sequences never reach the terminal
        text = Path(path).read_text(errors="replace")
        click.echo("\n".join(escape_controls(line) for line in text.split("\n")), nl=False)
    else:
        why = escape_controls(str(fields.get("error") or fields.get("file_error")))
        click.echo(f"run {record.run}: no dump file ({why})")
    if fields.get("error") and not fields.get("processes"):
        sys.exit(1)
