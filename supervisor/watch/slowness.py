"""Why a run runs slow: the evidence, each cause named only when it holds against the run's
own baseline (issue 43; the rule itself is :mod:`~dflashd.supervisor.model.pace`, pure).

- *Another process on the run's GPUs*: NVML lists a compute process on a GPU where the run
  holds memory, and it is not the run's (named with its pid and user).
- *The GPU itself*: its SM clock at least 15 % under, its power at least 25 % under, or its
  temperature at least 10 C over what the same GPU showed when the baseline was learnt (a
  throttle flag alone proves nothing: a healthy H200 reports the software power cap).
- *Waiting for a CPU*: the run's threads spent, together, at least a fifth of the wall time
  more runnable-but-waiting (``/proc/PID/task/*/schedstat``) than at the baseline.
- *Waiting for I/O*: a thread of the run in state D (uninterruptible, a disk or a mount).
- *A straggler rank*: the stacks dump taken when the slowness opened names the odd rank out
  (one rank computing while the others wait in their collectives); it follows as its own record.

Nothing holds: "cause unknown", never a guess.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from dflashd.supervisor.host.procfs import owner_name, run_queue_wait_ns, thread_states
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
    gpus_at_baseline: dict[int, GpuReading] = field(default_factory=dict)
    learnt: bool = False  # the baseline's evidence was taken

    def cpu_due(self, now: float) -> bool:
        """Time for the next reading (at most every :data:`CPU_EVERY_S`)."""
        return not self.cpu or now - self.cpu[-1][0] >= CPU_EVERY_S

    def read_cpu(self, pids: set[int], now: float) -> None:
        """The run's total run-queue wait now."""
        self.cpu.append((now, sum(run_queue_wait_ns(pid) for pid in pids)))

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
        causes.append(
            f"waiting for CPU: the run's threads waited {share:.2f} s per second for a CPU "
            f"(at its baseline {base:.2f})"
        )
    stuck = sum(thread_states(pid).count("D") for pid in pids)
    if stuck:
        causes.append(f"waiting for I/O: {stuck} thread(s) in uninterruptible sleep (state D)")
    return causes or [UNKNOWN]


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
        if _below(reading.power_w, then.power_w, POWER_DROP):
            out.append(f"GPU {i} power {reading.power_w:.0f} W (at baseline {then.power_w:.0f})")
        now_t, then_t = reading.temperature_c, then.temperature_c
        if now_t is not None and then_t is not None and now_t - then_t >= TEMPERATURE_RISE_C:
            out.append(f"GPU {i} temperature {now_t:.0f} C (at baseline {then_t:.0f})")
    return out


def _below(now: float | None, then: float | None, share: float) -> bool:
    return now is not None and then is not None and then > 0 and now < share * then
