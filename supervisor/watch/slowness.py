"""Why a run runs slow: the evidence, each cause named only when it holds against the run's
own baseline (issue 43; the rule itself is :mod:`~dflashd.supervisor.model.pace`, pure).

- *Another process on the run's GPUs*: NVML lists a compute process on a GPU where the run
  holds memory, and it is not the run's (named with its pid and user).
- *The GPU itself*: its SM clock at least 15 % under, its power at least 25 % under while it
  stays as busy, or its temperature at least 10 C over what the same GPU showed when the
  baseline was learnt (a throttle flag alone proves nothing: a healthy H200 reports the
  software power cap; a GPU that draws less because it waits for work is a symptom, not a
  cause: a curriculum's longer data step does that).
- *Waiting for a CPU*: the run's threads spent, together, at least a fifth of the wall time
  more runnable-but-waiting (``/proc/PID/task/*/schedstat``) than at the baseline; the
  processes of others running on the CPUs the run may use (its ``taskset``) are named.
- *Waiting for I/O*: a thread of the run in state D (uninterruptible, a disk or a mount) at
  most readings since the slowdown began, where it rarely was at the baseline (one reading
  that catches a thread reading a file is no cause: a job that reads its data does so always).
- *A straggler rank*: the stacks dump taken when the slowness opened names the odd rank out
  (one rank computing while the others wait in their collectives); it follows as its own record.

Nothing holds: "cause unknown", never a guess.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from dflashd.supervisor.host.procfs import all_stats, owner_name, run_queue_wait_ns, thread_states
from dflashd.supervisor.watch.nvml import GpuReading

CPU_EVERY_S: Final = 2.0  # the run's run-queue wait is read at most this often
CPU_WAIT_RISE: Final = 0.2  # seconds waiting for a CPU per wall second, above the baseline's
# ...or, for a mild slowdown, half the share of each second its steps now take over the
# baseline (a 1.2x slowdown adds 0.17 s a second: 0.2 of CPU wait could never explain it)
CPU_WAIT_EXPLAINS: Final = 0.5
CPU_WAIT_MIN_RISE: Final = 0.05


def cpu_wait_explains(share: float | None, base: float, ratio: float | None) -> bool:
    """The run's threads waited for a CPU enough more than at its baseline to explain a
    slowdown of ``ratio`` (its recent step time over its baseline's)."""
    if share is None:
        return False
    bar = CPU_WAIT_RISE
    if ratio is not None and ratio > 1.0:
        extra = 1.0 - 1.0 / ratio  # the share of each second the steps now take in excess
        bar = min(CPU_WAIT_RISE, max(CPU_WAIT_MIN_RISE, CPU_WAIT_EXPLAINS * extra))
    return share - base >= bar


CLOCK_DROP: Final = 0.85
POWER_DROP: Final = 0.75
TEMPERATURE_RISE_C: Final = 10.0
UNKNOWN: Final = "cause unknown"


@dataclass
class PaceEvidence:
    """What the causes are judged from: the run's CPU waits over time, and its GPUs as they
    were when the baseline was learnt."""

    cpu: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    cpu_at_baseline: tuple[float, float] | None = None  # (wait share, at) when it was learnt
    io: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=64))  # a D thread
    io_at_baseline: float | None = None  # the share of readings with one, at the baseline
    gpus_at_baseline: dict[int, GpuReading] = field(default_factory=dict)
    learnt: bool = False  # the baseline's evidence was taken

    def cpu_due(self, now: float) -> bool:
        """Time for the next reading (at most every :data:`CPU_EVERY_S`)."""
        return not self.cpu or now - self.cpu[-1][0] >= CPU_EVERY_S

    def read_cpu(self, pids: set[int], now: float) -> None:
        """The run's total run-queue wait now."""
        self.cpu.append((now, sum(run_queue_wait_ns(pid) for pid in pids)))
        self.io.append((now, any("D" in thread_states(pid) for pid in pids)))

    def io_share(self, since: float) -> tuple[float, int]:
        """The share of readings since ``since`` that found a thread in state D, and how many."""
        seen = [d for at, d in self.io if at >= since]
        return (sum(seen) / len(seen) if seen else 0.0), len(seen)

    def wait_share(self, since: float) -> float | None:
        """Seconds waiting for a CPU per wall second, from ``since`` to the last reading."""
        before = [r for r in self.cpu if r[0] <= since]
        start = before[-1] if before else (self.cpu[0] if self.cpu else None)
        if start is None or not self.cpu:
            return None
        end = self.cpu[-1]
        span = end[0] - start[0]
        return (end[1] - start[1]) / 1e9 / span if span >= 1.0 else None

    def baseline_learnt(self, gpus: tuple[GpuReading, ...], held: set[int], now: float) -> None:
        """The baseline was just learnt: the CPU wait and the GPUs as they are now."""
        self.learnt = True
        share = self.wait_share(now - 30.0)
        self.cpu_at_baseline = (share, now) if share is not None else None
        self.io_at_baseline = self.io_share(now - 30.0)[0]
        self.gpus_at_baseline = {r.index: r for r in gpus if r.index in held and r.error is None}


def slow_causes(
    evidence: PaceEvidence,
    *,
    pids: set[int],
    belongs: Any,
    gpus: tuple[GpuReading, ...],
    held: set[int],
    since: float,
    ratio: float | None = None,
) -> list[str]:
    """The causes that hold, each in words (``[UNKNOWN]`` when none does); ``ratio``: how
    much slower the run steps than its baseline."""
    causes = _gpu_intruders(gpus, held, belongs)
    causes += _gpu_off(evidence, gpus)
    share = evidence.wait_share(since)
    base = evidence.cpu_at_baseline[0] if evidence.cpu_at_baseline is not None else 0.0
    if share is not None and cpu_wait_explains(share, base, ratio):
        said = (
            f"waiting for CPU: the run's threads waited {share:.2f} s per second for a CPU "
            f"(at its baseline {base:.2f})"
        )
        hogs = cpu_hogs(pids, belongs)
        causes.append(said + (f"; on its CPUs: {', '.join(hogs)}" if hogs else ""))
    io_now, readings = evidence.io_share(since)
    io_then = evidence.io_at_baseline or 0.0
    if readings >= IO_READINGS and io_now >= IO_SHARE and io_now - io_then >= IO_RISE:
        stuck = sum(thread_states(pid).count("D") for pid in pids)
        causes.append(
            f"waiting for I/O: a thread in uninterruptible sleep (state D) at {io_now:.0%} of "
            f"the readings since it slowed (at its baseline {io_then:.0%}; {stuck} now)"
        )
    return causes or [UNKNOWN]


IO_READINGS: Final = 2  # readings (2 s apart) since the slowdown began
IO_SHARE: Final = 0.5  # ...at least half of them found a thread in state D
IO_RISE: Final = 0.4  # ...and that many more than at the baseline
MAX_HOGS: Final = 3


def cpu_hogs(pids: set[int], belongs: Any) -> list[str]:
    """Others' processes running now on the CPUs the run may use (its affinity: a job pinned
    with ``taskset`` to CPU 3 is slowed by what runs on CPU 3), the busiest first."""
    allowed: set[int] = set()
    for pid in pids:
        try:
            allowed |= os.sched_getaffinity(pid)
        except OSError:
            continue
    if not allowed:
        return []
    found = [
        st
        for st in all_stats().values()
        if st.state == "R"
        and st.processor in allowed
        and st.pid not in pids
        and not belongs(st.pid)
    ]
    found.sort(key=lambda st: st.cpu_ticks, reverse=True)
    return [
        f"pid {st.pid} (user {owner_name(st.pid) or '?'}) on CPU {st.processor}"
        for st in found[:MAX_HOGS]
    ]


def _gpu_intruders(gpus: tuple[GpuReading, ...], held: set[int], belongs: Any) -> list[str]:
    out = []
    for reading in gpus:
        if reading.index not in held:
            continue
        for proc in reading.processes:
            if not belongs(proc.pid):
                user = owner_name(proc.pid) or "?"
                used = "" if proc.used_mib is None else f", {proc.used_mib:.0f} MiB"
                out.append(
                    f"another process on GPU {reading.index}: pid {proc.pid} (user {user}{used})"
                )
    return out


def _gpu_off(evidence: PaceEvidence, gpus: tuple[GpuReading, ...]) -> list[str]:
    out = []
    for reading in gpus:
        then = evidence.gpus_at_baseline.get(reading.index)
        if then is None or reading.error is not None:
            continue
        i = reading.index
        if _below(reading.sm_clock_mhz, then.sm_clock_mhz, CLOCK_DROP):
            out.append(
                f"GPU {i} clock {reading.sm_clock_mhz:.0f} MHz (at baseline {then.sm_clock_mhz:.0f})"
            )
        busy = _not_below(reading.utilization_pct, then.utilization_pct, BUSY_SLACK_PCT)
        if busy and _below(reading.power_w, then.power_w, POWER_DROP):
            out.append(f"GPU {i} power {reading.power_w:.0f} W (at baseline {then.power_w:.0f})")
        now_t, then_t = reading.temperature_c, then.temperature_c
        if now_t is not None and then_t is not None and now_t - then_t >= TEMPERATURE_RISE_C:
            out.append(f"GPU {i} temperature {now_t:.0f} C (at baseline {then_t:.0f})")
    return out


BUSY_SLACK_PCT: Final = 10.0


def _not_below(now: float | None, then: float | None, slack: float) -> bool:
    """As busy as then (within ``slack`` points); unknown counts as not."""
    return now is not None and then is not None and now >= then - slack


def _below(now: float | None, then: float | None, share: float) -> bool:
    return now is not None and then is not None and then > 0 and now < share * then
