"""Slow, diverged and the checkpoint interval, as the pure rules decide them (issue 43):
scripted step times and loss curves in, incidents out; no process, no clock."""

from __future__ import annotations

import math
import random

import pytest

from dflashd.supervisor.model.advice import AdviceInputs, advise, best_interval, goodput_at
from dflashd.supervisor.model.divergence import STAY_OUT, LossWatch, watched
from dflashd.supervisor.model.pace import (
    BASELINE_SAMPLES,
    SUSTAIN_S,
    WARMUP_SAMPLES,
    Pace,
    paced,
)

STEP_S = 0.0164  # an H200's step of a small drafter: 16.4 ms


def run_pace(
    intervals: list[tuple[float, int]], start: float = 0.0
) -> tuple[Pace, list[tuple[float, str]]]:
    """Feed (interval, steps) samples; the pace at the end and each (time, opened/closed)."""
    pace, now, said = Pace(), start, []
    for interval, steps in intervals:
        now += interval
        pace, change = paced(pace, interval, steps, now)
        if change.opened:
            said.append((now, "opened"))
        if change.closed:
            said.append((now, "closed"))
    return pace, said


def steady(
    n: int, step_s: float = STEP_S, every: int = 50, jitter: float = 0.0
) -> list[tuple[float, int]]:
    rng = random.Random(7)
    return [(step_s * every * (1 + rng.uniform(-jitter, jitter)), every) for _ in range(n)]


def test_the_baseline_is_the_runs_own_steady_step_after_its_warm_up() -> None:
    compile_first = [(30.0, 50), *steady(WARMUP_SAMPLES - 1)]  # the first compile: warm-up
    pace, said = run_pace(compile_first + steady(BASELINE_SAMPLES + 40, jitter=0.1))
    assert said == []
    assert pace.baseline_s == pytest.approx(STEP_S, rel=0.1)
    assert pace.lost_s == pytest.approx(0.0, abs=STEP_S * 50 * 5)  # noise, no slowness


def test_a_job_twice_as_slow_for_a_minute_is_one_incident_that_closes() -> None:
    every = 10  # a log line each 10 steps: 0.164 s apart
    before = steady(WARMUP_SAMPLES + BASELINE_SAMPLES + 30, every=every)
    slow_for = round(60.0 / (2 * STEP_S * every))
    slow = steady(slow_for, step_s=2 * STEP_S, every=every)
    pace, said = run_pace([*before, *slow, *steady(40, every=every)])
    assert [what for _, what in said] == ["opened", "closed"]
    start = sum(i for i, _ in before)
    opened_after = said[0][0] - start
    assert SUSTAIN_S <= opened_after <= SUSTAIN_S + 5.0  # sustained, not one slow step
    assert pace.worst_ratio == pytest.approx(2.0, rel=0.05)
    assert pace.lost_s == pytest.approx(slow_for * STEP_S * every, rel=0.05)  # Σ step - baseline


@pytest.mark.parametrize("pause_s", [30.0, 100.0, 600.0])
def test_an_eval_or_a_checkpoint_pause_between_steps_is_no_slowdown(pause_s: float) -> None:
    timeline = steady(WARMUP_SAMPLES + BASELINE_SAMPLES + 20)
    for _ in range(5):  # a pause every 20 samples: a checkpoint routine
        timeline += [(pause_s, 50), *steady(20)]
    pace, said = run_pace(timeline)
    assert said == []
    assert pace.lost_s < 1.0  # pauses are not slowness
    assert len(pace.pauses) == 5 and min(pace.pauses) > pause_s * 0.9  # but they are seen


def test_noisy_small_batch_steps_raise_nothing() -> None:
    rng = random.Random(3)
    noisy = [(STEP_S * 10 * rng.lognormvariate(0.0, 0.35), 10) for _ in range(3000)]
    _pace, said = run_pace(noisy)
    assert said == []


def test_nothing_is_judged_before_a_baseline() -> None:
    _pace, said = run_pace(steady(5) + steady(200, step_s=STEP_S * 3))
    assert said == []  # it was never fast: slow against what?


# -- diverged -----------------------------------------------------------------------------------


def feed(losses: list[float], start_step: int = 1) -> tuple[LossWatch, int | None]:
    watch, fired_at = LossWatch(), None
    for i, loss in enumerate(losses):
        watch, fired = watched(watch, loss, start_step + i)
        if fired:
            fired_at = start_step + i
    return watch, fired_at


def test_a_nan_loss_that_stays_diverges_at_its_first_step() -> None:
    watch, fired = feed([2.0, 1.9, 1.8, math.nan, math.nan, math.nan, 1.7])
    assert fired == 6 and watch.diverged_at == 4 and watch.last_good_step == 3
    assert "nan" in (watch.why or "")


def test_a_loss_scalers_skipped_steps_are_no_divergence() -> None:
    """fp16 with a dynamic loss scale: a NaN (or inf) now and then, two in a row at worst,
    the next loss finite again, for hundreds of steps."""
    rng = random.Random(5)
    curve = [2.5 * math.exp(-i / 400) + 1.0 + rng.gauss(0, 0.05) for i in range(800)]
    for i in range(40, 800, 37):
        curve[i] = math.nan if i % 2 else math.inf
        if i % 3 == 0:
            curve[i + 1] = math.nan
    watch, fired = feed(curve)
    assert fired is None and not watch.diverged


def test_a_contrastive_loss_with_a_recovering_spike_is_no_divergence() -> None:
    rng = random.Random(9)
    curve = [math.log(256) * math.exp(-i / 300) + 0.4 + rng.gauss(0, 0.08) for i in range(600)]
    curve[300:304] = [9.0, 8.0, 6.0, 4.0]  # a spike, four losses out, then back in range
    watch, fired = feed(curve)
    assert fired is None and not watch.diverged


def test_a_loss_that_leaves_its_range_and_stays_out_diverges_where_it_began() -> None:
    curve = [4.0 * 0.98**i + 0.05 * math.sin(i) for i in range(120)]
    watch, fired = feed([*curve, *([40.0] * STAY_OUT)])
    assert fired == 120 + STAY_OUT and watch.diverged_at == 121
    assert watch.last_good_step == 120


def test_a_spike_that_comes_back_is_no_divergence() -> None:
    curve = [3.0 - 0.01 * i for i in range(100)]
    spikes = curve[:60] + [30.0] * (STAY_OUT - 1) + curve[60:]
    watch, fired = feed(spikes)
    assert fired is None and not watch.diverged


def real_like_curves() -> list[list[float]]:
    """Curves shaped as the frameworks print them: nanoGPT's fast fall, a plateau with noise,
    a small-batch curve whose steps jump by a third, a warm-up bump, an LR restart."""
    rng = random.Random(11)
    nanogpt = [10.9 * math.exp(-i / 80) + 1.2 + rng.gauss(0, 0.05) for i in range(600)]
    plateau = [2.3 + rng.gauss(0, 0.15) for _ in range(1000)]
    small_batch = [
        max(0.01, 1.5 * math.exp(-i / 300) + 0.6 + rng.gauss(0, 0.2)) for i in range(1500)
    ]
    bump = [5.0 - 0.02 * i + (0.8 if 100 <= i < 110 else 0.0) for i in range(200)]
    restart = [2.0 - 0.001 * (i % 300) + rng.gauss(0, 0.02) for i in range(900)]
    return [nanogpt, plateau, small_batch, bump, restart]


@pytest.mark.parametrize("index", range(5))
def test_real_shaped_and_noisy_curves_stay_silent(index: int) -> None:
    _watch, fired = feed(real_like_curves()[index])
    assert fired is None


def test_the_same_step_posted_again_is_judged_once() -> None:
    watch = LossWatch()
    for _ in range(3):
        watch, _ = watched(watch, 2.0, 7)
    assert watch.seen == 1


# -- the checkpoint interval ---------------------------------------------------------------


def test_the_advice_matches_the_formula_on_its_inputs() -> None:
    """A scripted crash schedule: 6 failures over 30 h of work, each costing 5 min to recover
    and redoing 30 min (checkpoints every hour), a checkpoint costing 40 s."""
    given = AdviceInputs(
        failures=6,
        working_s=30 * 3600.0,
        recovery_s=6 * 300.0,
        redone_s=6 * 1800.0,
        checkpoint_cost_s=40.0,
    )
    advice = advise(given)
    assert advice is not None
    mtbf, recovery, cost = 5 * 3600.0, 300.0, 40.0
    assert (advice.mtbf_s, advice.recovery_s) == (mtbf, recovery)
    assert advice.interval_now_s == pytest.approx(3600.0)
    assert advice.interval_best_s == pytest.approx(math.sqrt(2 * cost * mtbf) - cost)
    now = 1 - (cost / 3600 + (recovery + 1800) / mtbf)
    best_t = advice.interval_best_s
    best = 1 - (cost / best_t + (recovery + best_t / 2) / mtbf)
    assert (advice.goodput_now, advice.goodput_best) == (pytest.approx(now), pytest.approx(best))
    assert advice.goodput_best > advice.goodput_now and advice.worth_saying
    # the optimum is the optimum: its neighbours do no better
    for t in (best_t * 0.8, best_t * 1.25):
        assert goodput_at(t, cost_s=cost, mtbf_s=mtbf, recovery_s=recovery) <= advice.goodput_best


@pytest.mark.parametrize(
    "given",
    [
        AdviceInputs(1, 36000.0, 300.0, 1800.0, 40.0),  # one failure: no rate
        AdviceInputs(5, 36000.0, 300.0, 0.0, 40.0),  # nothing redone: today's interval unknown
        AdviceInputs(5, 36000.0, 300.0, 1800.0, None),  # no checkpoint ever seen
    ],
)
def test_no_advice_without_the_inputs_to_support_it(given: AdviceInputs) -> None:
    assert advise(given) is None


def test_an_interval_near_the_best_is_not_worth_a_word() -> None:
    best = best_interval(cost_s=40.0, mtbf_s=18000.0)
    given = AdviceInputs(6, 6 * 18000.0, 6 * 300.0, 6 * best / 2, 40.0)
    advice = advise(given)
    assert advice is not None and not advice.worth_saying


def test_the_report_says_the_advice_from_the_log_alone() -> None:
    """Six crashes, each an hour after its launch, each redoing 30 min (checkpoints hourly) and
    costing 5 min of start-up, with 40 s checkpoint pauses seen: the report's goodput section
    says the better interval, with its inputs."""
    from dflashd.supervisor.client.goodputhtml import GoodputData, goodput_section
    from dflashd.supervisor.model.events import Event

    data = GoodputData()
    at = 1_800_000_000.0
    for run in range(1, 7):
        data.take(Event.SPAWN, run, at, {"downtime_s": 0.0})
        cost = {"startup_s": 300.0, "redone_s": 1800.0, "productive_s": 1800.0}
        at += 3900.0
        exit_fields = {"verdict": "crashed", "reason": "SIGSEGV", "cost": cost}
        data.take(Event.EXIT, run, at, {**exit_fields, "checkpoint_pause_s": 40.0})
    page = goodput_section(data, at - 6 * 3900.0, at)
    assert "checkpointing every" in page and "(an estimate)" in page
    assert "checkpoint_cost_s 40.0" in page and "failures 6" in page


def test_metrics_carry_the_loss_the_pace_and_an_open_slowdown() -> None:
    from dflashd.supervisor.speak.metrics import _training_families

    snapshot = {
        "loss": 2.31,
        "pace": {"baseline_step_s": 0.0164, "recent_step_s": 0.035, "ratio": 2.13},
        "slow": {"ratio": 2.13, "causes": ["another process on GPU 0: pid 7 (user bob)"]},
        "diverged": None,
    }
    families = {f.name: f for f in _training_families(snapshot)}
    assert families["dflashd_loss"].samples[0].value == 2.31
    steps = {s.labels["which"]: s.value for s in families["dflashd_step_seconds"].samples}
    assert steps == {"baseline": 0.0164, "recent": 0.035}
    assert families["dflashd_slow"].samples[0].value == 1.0
    assert families["dflashd_diverged"].samples[0].value == 0.0
