"""The restart policy: a pure function from a verdict and the history to an action.

Early deaths (a run that never reached its first step) and runtime crashes have separate
budgets.  The early budget is reset by a run that reaches its first step; the runtime
budget (and the backoff exponent) by ``stable_after_s`` of progress.  A runtime crash after
such a stretch, or after new progress (a best step beyond every earlier run's), relaunches
at once; backoff begins with the next failure that made no new progress, doubles per
consecutive failure, with ±20 % jitter, and never exceeds the ceiling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from dflashd.supervisor.model.bounds import bounded_field as _key
from dflashd.supervisor.model.bounds import seconds_field as _seconds
from dflashd.supervisor.model.verdicts import EARLY_DEATHS, UNFIXABLE_REASONS, AnyVerdict, Verdict


@dataclass(frozen=True)
class RestartConfig:
    """The ``[restart]`` table: the policy's parameters (the config parses it, :func:`decide` reads it)."""

    early_retries: int = _key(3, low=0, high=1000)
    runtime_retries: int = _key(10, low=0, high=100000)
    stable_after_s: float = _seconds(600.0)
    # A run that showed signs of life (output, notify, GPU, CPU) this long before dying had
    # left its start-up: a runtime crash even when no step was seen, never an early death.
    early_death_s: float = _seconds(300.0)
    # Runs that end without passing the highest step any earlier run reached: after this many
    # in a row, fatal (a crash loop that resumes and dies at the same step).  0: never.
    no_progress_restarts: int = _key(3, low=0, high=100000)
    backoff_initial_s: float = _seconds(1.0, above=None, low=0.0)
    backoff_max_s: float = _seconds(300.0)
    clear_cache_on_early_death: bool = True
    # A failure that retrying cannot fix (exec failed, ImportError, SyntaxError before the
    # first step, a no-restart exit code) is fatal at once; true retries it like any early death.
    retry_unfixable: bool = False
    no_restart_exit_codes: tuple[int, ...] = (78,)
    stop_timeout_s: float = _seconds(30.0, above=None, low=0.0)


_JITTER: Final = 0.2


class Action(StrEnum):
    """What the daemon does next."""

    RESTART = "restart"
    FATAL = "fatal"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class RestartHistory:
    """The counters the policy keeps between runs."""

    early_deaths: int = 0
    runtime_crashes: int = 0
    consecutive_failures: int = 0
    best_step: int | None = None  # the highest step any run reached
    stuck_runs: int = 0  # runs in a row that ended without passing ``best_step``
    free_restart: bool = False  # the chain began with a crash after stable progress (no wait)
    last_early_signature: str | None = None  # the last early death's last error line
    last_hang: tuple[int | None, str] | None = None  # the last hang's step and stack signature


@dataclass(frozen=True, slots=True)
class Decision:
    """The action, its delay, whether to clear the owned caches, why, and the history after it."""

    action: Action
    delay_s: float
    clear_cache: bool
    reason: str
    history: RestartHistory


def backoff_delay(failures: int, policy: RestartConfig, jitter: float) -> float:
    """Delay before relaunch number ``failures`` (1-based), jittered, capped at the ceiling.

    ``jitter`` is a uniform sample in [0, 1) supplied by the caller (keeps this pure).
    """
    if policy.backoff_initial_s <= 0 or failures <= 0:
        return 0.0
    base = policy.backoff_initial_s * (2.0 ** max(0, failures - 1))
    jittered = base * (1.0 - _JITTER + 2.0 * _JITTER * jitter)
    return min(policy.backoff_max_s, jittered)


def decide(
    verdict: AnyVerdict,
    *,
    exit_code: int | None,
    reached_first_step: bool,
    progress_s: float,
    history: RestartHistory,
    policy: RestartConfig,
    jitter: float,
    reason: str = "",
    worker_exit_code: int | None = None,
    step: int | None = None,
    tail: tuple[str, ...] = (),
    frames: tuple[str, ...] = (),
) -> Decision:
    """Decide what follows a run that ended with ``verdict`` (``reason``: the classifier's detail).

    ``reached_first_step``: the run left its start-up (a step seen, or a runtime crash without
    one); its failures then count against the runtime budget.  ``worker_exit_code``: for a
    torchrun job, its first failed worker's code (torchrun exits 1).  ``step``: the highest
    step the run reached; ``policy.no_progress_restarts`` runs in a row that end without
    passing the best step of any earlier run are fatal (``no_progress_past_step_N``).
    ``tail``: the run's last output lines, the evidence for clearing the compile caches
    (:func:`cache_evidence`); ``frames``: the top frames of the stacks dflashd took before it
    ended a live run (``no_gpu_memory``, a stall), evidence too when they are inside a compile
    or a build lock (:func:`frames_evidence`), never when the job waits in its own code.
    """
    if verdict in (Verdict.COMPLETED, Verdict.STOPPED):
        return Decision(Action.DONE, 0.0, False, verdict.value, history)
    if verdict is Verdict.DIVERGED:  # a relaunch resumes from a checkpoint to diverge again
        return Decision(Action.FATAL, 0.0, False, reason or "loss_diverged", history)
    if exit_code is not None and exit_code in policy.no_restart_exit_codes:
        return Decision(Action.FATAL, 0.0, False, f"no_restart_exit_code_{exit_code}", history)
    if worker_exit_code is not None and worker_exit_code in policy.no_restart_exit_codes:
        why = f"no_restart_exit_code_{worker_exit_code}_in_worker"
        return Decision(Action.FATAL, 0.0, False, why, history)
    if not policy.retry_unfixable:
        if verdict is Verdict.SPAWN_FAILED:
            return Decision(Action.FATAL, 0.0, False, "spawn_failed", history)
        if not reached_first_step and reason in UNFIXABLE_REASONS:
            return Decision(Action.FATAL, 0.0, False, f"unfixable_{reason}", history)

    if verdict is Verdict.STALLED and reason == "hung" and frames:
        # the same frames at the same step as the hang before: a relaunch would hang again
        hang = (step, _DIGITS.sub("N", " | ".join(frames))[:2000])
        if history.last_hang == hang:
            why = f"same_hang_twice_at_step_{step}"
            return Decision(Action.FATAL, 0.0, False, why, replace(history, last_hang=hang))
        history = replace(history, last_hang=hang)
    if reached_first_step:
        history = replace(history, early_deaths=0)
    stable = progress_s >= policy.stable_after_s
    if stable:
        history = replace(history, runtime_crashes=0, consecutive_failures=0, free_restart=False)
    # New progress (a best step beyond every earlier run's): the chain of failures starts over.
    new_progress = (
        reached_first_step
        and step is not None
        and (history.best_step is None or step > history.best_step)
    )
    if new_progress:
        history = replace(history, consecutive_failures=0, free_restart=False)
    history = _track_best_step(history, step)
    limit = policy.no_progress_restarts
    if limit and history.stuck_runs >= limit and history.best_step is not None:
        why = f"no_progress_past_step_{history.best_step}"
        return Decision(Action.FATAL, 0.0, False, why, history)

    failures = history.consecutive_failures + 1
    if not reached_first_step:
        early = history.early_deaths + 1
        history = replace(history, early_deaths=early, consecutive_failures=failures)
        if early > policy.early_retries:
            return Decision(Action.FATAL, 0.0, False, "early_retries_exhausted", history)
    else:
        crashes = history.runtime_crashes + 1
        history = replace(history, runtime_crashes=crashes, consecutive_failures=failures)
        if crashes > policy.runtime_retries:
            return Decision(Action.FATAL, 0.0, False, "runtime_retries_exhausted", history)

    clear = False
    if policy.clear_cache_on_early_death and verdict in EARLY_DEATHS:
        signature = death_signature(tail)
        again = signature is not None and signature == history.last_early_signature
        named = cache_evidence(tail) is not None or frames_evidence(frames) is not None
        clear = named or (again and history.early_deaths >= 2)
        history = replace(history, last_early_signature=signature)
    if (stable or new_progress) and reached_first_step:
        # A runtime crash after a healthy stretch or new progress: relaunch at once (a wait
        # buys nothing the job's own start-up does not already take); backoff begins with
        # the next failure that makes no new progress.
        return Decision(
            Action.RESTART, 0.0, clear, verdict.value, replace(history, free_restart=True)
        )
    delay = backoff_delay(failures - (1 if history.free_restart else 0), policy, jitter)
    return Decision(Action.RESTART, delay, clear, verdict.value, history)


# What points at the compile caches: inductor, triton, JIT-built extensions, a compiler or a
# build that failed, a build lock.  Anything else is the job's own failure: caches kept.
_CACHE_SIGNS: Final = re.compile(
    r"torch/_inductor|torch\._inductor|InductorError|BackendCompilerFailed|CppCompileError"
    r"|triton|torch_extensions|cpp_extension|ninja|CalledProcessError.*(?:gcc|g\+\+|nvcc|cc1)"
    r"|error: command .*(?:gcc|g\+\+|nvcc)|compilation (?:failed|terminated)|CompilationError"
    r"|[Bb]uild(?:ing)? (?:failed|extension)|FileBaton|[/ ]lock\b",
)
_DIGITS: Final = re.compile(r"\d+")


def cache_evidence(tail: tuple[str, ...]) -> str | None:
    """The first line of a dead run's output that names a compile cache or a build, if any."""
    for line in tail:
        if _CACHE_SIGNS.search(line):
            return line[:300]
    return None


# In a stack, only frames inside the compilers and the build machinery say "the caches":
# inductor, triton, a JIT extension build (its FileBaton lock, ninja), a compiler process.
_FRAME_SIGNS: Final = re.compile(
    r"torch/_inductor|torch\._inductor|[(/]triton/|torch/utils/cpp_extension|torch_extensions"
    r"|file_baton|FileBaton|/ninja|torch/_dynamo/.*compile"
)


def frames_evidence(frames: tuple[str, ...]) -> str | None:
    """The first stack frame inside a compile or a build lock, if any (a job waiting in its
    own code, a lock of its own or a sleep, gives none)."""
    for frame in frames:
        if _FRAME_SIGNS.search(frame):
            return frame[:300]
    return None


def death_signature(tail: tuple[str, ...]) -> str | None:
    """A death's last non-empty line with its numbers blanked: the same failure twice reads
    the same (pids, addresses and times aside)."""
    for line in reversed(tail):
        if line.strip():
            return _DIGITS.sub("N", line.strip())[:300]
    return None


def _track_best_step(history: RestartHistory, step: int | None) -> RestartHistory:
    """A run that passed the best step resets the count; one that ended at or below it adds one.

    A run with no step seen says nothing either way (its start-up has its own budget).
    """
    if step is None:
        return history
    if history.best_step is None or step > history.best_step:
        return replace(history, best_step=step, stuck_runs=0)
    return replace(history, stuck_runs=history.stuck_runs + 1)
