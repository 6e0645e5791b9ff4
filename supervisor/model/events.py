"""The names of dflashd's own records (``src = "dflashd"``): one vocabulary for writer and readers.

The daemon writes them; ``report``, ``render``, the tests and any user's ``jq`` read them.
A StrEnum compares equal to its string, so records read back from disk match these members.
"""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    """Every ``event`` dflashd writes into the run log."""

    # a run's life
    SPAWN = "spawn"
    LAUNCHED = "launched"
    FIRST_STEP = "first_step"
    PROGRESS = "progress"
    CHILD_STATUS = "child_status"
    ENDING_RUN = "ending_run"
    STOPPING = "stopping"
    STOP_TIMEOUT = "stop_timeout"
    STACKS = "stacks"  # a live dump of the run's stacks (dflashd stacks, or before a kill)
    HANG_SUSPECT = "hang_suspect"  # a steady run's step is overdue: its processes are sampled
    HANG_CHECK = "hang_check"  # a round of samples found work (or could not tell): not ended
    PACE = "pace"  # the run's own steady step time, learnt after its warm-up (pace.py)
    SLOW = "slow"  # the run steps 20 % or more below its own baseline, sustained (pace.py)
    SLOW_CAUSE = "slow_cause"  # the stacks taken at a slowdown name a straggler rank
    SLOW_OVER = "slow_over"  # back to its own pace
    DIVERGED = "diverged"  # the loss became NaN/infinite, or left its range and stayed out
    EXIT = "exit"
    LEFTOVER_PROCESSES = "leftover_processes"
    SHUTDOWN_ENDED = "shutdown_ended"  # the daemon's exit: each process it ended, named
    ENDING_LEFTOVERS = "ending_leftovers"  # before a relaunch: what the dead run left running
    LAUNCH_DEFERRED = "launch_deferred"  # out of descriptors (EMFILE): retried, not a verdict
    # a node of a larger job: what torchrun's agent handled itself (elastic.py)
    WORKER_FAILED = "worker_failed"
    WORKERS_RESTARTED = "workers_restarted"
    RENDEZVOUS = "rendezvous"
    # what follows a run
    RESTART = "restart"
    HOLD_OVER = "hold_over"  # a relaunch a rule held (room on a full disk) goes ahead
    CACHE_CLEARED = "cache_cleared"
    FATAL = "fatal"
    DONE = "done"
    ALERT = "alert"
    # GPUs
    GPU = "gpu"
    GPU_SNAPSHOT = "gpu_snapshot"
    GPU_XID = "gpu_xid"
    STANDBY = "standby"  # the next run's interpreter started (warm_standby), or why not
    GPU_PREFLIGHT = "gpu_preflight"  # the GPUs read before a relaunch (model/preflight.py)
    GPU_UNUSABLE = "gpu_unusable"  # one needs a reset or a reboot: not relaunched onto
    GPU_CHECKS_OFF = "gpu_checks_off"
    GPU_MEMORY_HELD = "gpu_memory_held"
    GPU_MEMORY_RELEASED = "gpu_memory_released"
    GPU_RELEASE_TIMEOUT = "gpu_release_timeout"
    GPU_FOREIGN_HOLDER = "gpu_foreign_holder"
    # the daemon itself
    RECOVERED_ORPHAN = "recovered_orphan"
    ORPHAN_NOT_OURS = "orphan_not_ours"
    METRICS_ON = "metrics_on"
    METRICS_OFF = "metrics_off"
    LOG_TORN_TAIL = "log_torn_tail"
    LOG_DROPPED = "log_dropped"  # written by dflashd.logs.writer (which knows no supervisor names)
    DAEMON_EXIT = "daemon_exit"
    GOODPUT_CARRIED = "goodput_carried"  # at start: the time no daemon was here, and its bucket
    HOME_REPLACED = "home_replaced"  # the home's path names another directory now: kept to ours
