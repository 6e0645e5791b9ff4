"""Ended runs whose processes outlived them: noted at death, ended before the next launch.

A run's custody (its cgroup, or its pidfd-proven members) outlives its reaped child while
anything of it lives.  :meth:`EndedRuns.settle` carries out the applier's
``SettleProcesses`` effect; :meth:`EndedRuns.leftovers` names what is left before a
relaunch (the model ends it: model/leftovers.py); :meth:`EndedRuns.sweep` ends everything at
shutdown.  Proven processes only: every signal goes through the run's custody.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from dflashd.supervisor.host.custody import end_adopted
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.proof import RunCustody
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.leftovers import LEFTOVER_GIVE_UP_S, Leftovers
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.watch.run import Run


class EndedRuns:
    """The custody of ended runs until nothing of them is left."""

    def __init__(
        self, ops: ProcessOps, reporter: Recorder, on_empty: Callable[[int], None] | None = None
    ) -> None:
        self.ops, self.reporter = ops, reporter
        self.ended: list[RunCustody] = []  # ended runs whose processes may outlive them
        self.on_empty = on_empty  # posts RunEmptied to the loop

    def settle(self, run: Run, *, kill_now: bool) -> None:
        """At death: ended by dflashd, nothing of it lives on; else leftovers are noted."""
        custody = run.custody
        if custody is None:
            return
        if kill_now:
            if members := sorted(custody.members()):  # every process dflashd ends is named
                named = {str(pid): self.ops.cmdline(pid) for pid in members}
                self.reporter.record(
                    run.run_no,
                    Event.ENDING_LEFTOVERS,
                    pids=named,
                    signal="SIGKILL",
                    sigkill_at_once=members,
                    by=custody.mode,
                )
            custody.kill_all()
        elif leftovers := sorted(custody.members()):
            self.reporter.record(run.run_no, Event.LEFTOVER_PROCESSES, pgid=run.pid, pids=leftovers)
        # Only runs that may still have processes: a crash loop must not grow this list.
        self._forget_empty()
        self.ended.append(custody)

    def leftovers(self, run: Run | None) -> Leftovers | None:
        """What the dead run left running, as its custody proves it (its cgroup's processes,
        or the pidfd-proven members: its group while the child was unreaped, descendants of
        proven members, and processes carrying this home's id and the run's number: a
        torchrun agent's workers run in sessions of their own), named; None once nothing is
        left.  What to do with them is the model's (model/leftovers.py)."""
        custody = run.custody if run is not None and not run.alive else None
        pids = custody.members() if custody is not None else set()
        if not pids or run is None or custody is None:
            self._forget_empty()
            return None
        named = tuple((pid, self.ops.cmdline(pid)) for pid in sorted(pids))
        return Leftovers(run.run_no, named, custody.mode)

    def watch_until_empty(self, run: Run) -> None:
        """A thread waits for the run to empty (``cgroup.events``, or pidfds turning readable)
        and wakes the loop: the relaunch follows the last leftover at once, not a poll."""
        notify, custody, run_no = self.on_empty, run.custody, run.run_no
        if notify is None or custody is None:
            return

        def watch() -> None:
            if custody.wait_empty(LEFTOVER_GIVE_UP_S + 1.0):
                notify(run_no)

        threading.Thread(target=watch, name=f"dflashd-empty-{run_no}", daemon=True).start()

    def _forget_empty(self) -> None:
        """Ended runs with nothing left: close their custody (pidfds, cgroups)."""
        keep: list[RunCustody] = []
        for custody in self.ended:
            if custody.empty():
                custody.close()
            else:
                keep.append(custody)
        self.ended = keep

    def sweep(self, run: Run | None, *, own_descendants: bool) -> None:
        """Shutdown: every run's processes end with us, proven ones only, until none is left."""
        custodies = list(self.ended)
        if run is not None and run.custody is not None and run.custody not in custodies:
            custodies.append(run.custody)
        for custody in custodies:
            if not custody.empty():
                named = {str(pid): self.ops.cmdline(pid) for pid in sorted(custody.members())}
                self._name_ended(run, named, custody.mode)
                custody.signal_all(signal.SIGTERM)
                custody.signal_all(signal.SIGCONT)
                if not custody.wait_empty(2.0):
                    custody.kill_all()
                    custody.wait_empty(5.0)
        for custody in custodies:
            custody.close()
        self.ended = []
        if own_descendants:
            # pidfd mode's last net (a grandchild that scrubbed its environment): named too
            # our own helpers (alert commands, the log's compression helper, py-spy) are not
            # the run's: they finish their work (the log's close waits for the helper)
            mine = self.reporter.helper_pids()
            self._name_ended(run, end_adopted(exclude=mine), "adopted")

    def _name_ended(self, run: Run | None, named: dict[str, str], by: str) -> None:
        """Every process dflashd ends at shutdown is named in a record, in every custody mode."""
        if named:
            run_no = run.run_no if run is not None else 0
            self.reporter.record(run_no, Event.SHUTDOWN_ENDED, pids=named, by=by)
