"""The measurement protocol: every arm measures the same number of final-phase steps from one config, warm-up steps
stay out of the statistics, unsteady runs are flagged, intervals cover what they claim, and the machine reading
degrades to "not available" without a GPU."""
import numpy as np
import pytest
from omegaconf import OmegaConf

from harness.rank import machine
from harness.contract import protocol
from harness.config.compose import compose_point
from harness.driver.validate import validate
from harness.contract.steps import phase_of, summarize_phases
from harness.contract.stats import median_interval, ratio_interval, runs_interval

ARMS = [["arm=zero3"], ["arm=zero_offload"], ["arm=deepcompile", "arm.schedule=default"],
        ["arm=deepcompile", "arm.schedule=z3_only"], ["arm=ds_offload"], ["arm=offload"]]


def config(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_point(list(overrides)), resolve=True)


def rows_of(counts: protocol.StepCounts, starts: list[int], time=lambda step: 1.0, **fields) -> list[dict]:
    """Step rows of a run of counts.total steps with the given phase starts."""
    rows = []
    for step in range(counts.total):
        phase, phase_step = phase_of(step, starts)
        rows.append({"step": step, "phase": phase, "phase_step": phase_step, "step_time_s": time(step), **fields})
    return rows


@pytest.mark.parametrize("arm", ARMS, ids=lambda overrides: "-".join(o.partition("=")[2] for o in overrides))
def test_every_arm_measures_measure_steps_final_phase_steps_from_one_config(arm):
    typed = validate(config(*arm, "train.warmup_steps=2", "train.measure_steps=20"), gpu_count=0)
    starts = typed.arm.phase_start_steps(typed)
    counts = protocol.step_counts(typed.train, starts)
    assert counts.total == starts[-1] + 1 + 2 + 20
    (*_, final) = summarize_phases(rows_of(counts, starts), warmup=counts.warmup)
    assert final["first_step"] == starts[-1] and final["n"] == 20 == counts.measured
    assert final["measured_steps"] == list(range(starts[-1] + 3, counts.total))


def test_the_arms_phase_starts_differ_so_their_totals_do():
    totals = {name: protocol.step_counts(typed.train, typed.arm.phase_start_steps(typed)).total
              for name in ("deepcompile", "ds_offload", "offload")
              for typed in [validate(config(f"arm={name}"), gpu_count=0)]}
    assert totals == {"deepcompile": 5 + 1 + 2 + 3, "ds_offload": 1 + 1 + 2 + 3, "offload": 2 + 1 + 2 + 3}


def test_train_steps_sets_the_total_and_the_final_phase_measures_what_is_left():
    cfg = config("arm=offload", "train.steps=10", "train.measure_steps=null", "train.warmup_steps=1")
    resolved = protocol.with_step_counts(cfg, protocol.step_counts(validate(cfg, gpu_count=0).train, [0, 2]))
    assert resolved["train"]["steps"] == 10 and resolved["train"]["measure_steps"] == 10 - 2 - 1 - 1
    default = config("train.measure_steps=4")
    counts = protocol.step_counts(validate(default, gpu_count=0).train, [0])
    assert protocol.with_step_counts(default, counts)["train"]["steps"] == 1 + 2 + 4


def test_warmup_steps_are_left_out_of_every_phase():
    counts = protocol.StepCounts(total=12, final_start=4, warmup=2, measured=5)
    slow = {1, 2, 5, 6}  # the warm-up steps after each phase's compile step (steps 0 and 4)
    (first, final) = summarize_phases(rows_of(counts, [0, 4], lambda step: 9.0 if step in slow else 1.0), warmup=2)
    assert first["measured_steps"] == [3] and final["measured_steps"] == [7, 8, 9, 10, 11]
    assert first["step_time_s"]["median"] == final["step_time_s"]["median"] == 1.0
    (_, counted) = summarize_phases(rows_of(counts, [0, 4], lambda step: 9.0 if step in slow else 1.0))  # warmup=0
    assert counted["measured_steps"] == [5, 6, 7, 8, 9, 10, 11] and counted["step_time_s"]["p75"] > 1.0


def test_a_trend_is_flagged_and_a_flat_series_is_not():
    flat = [{"step_time_s": 1.0 + 0.001 * (i % 2), "peak_reserved_bytes": 10**9, "alloc_retries": 0}
            for i in range(20)]
    trend = [{**row, "step_time_s": 1.0 + 0.005 * i} for i, row in enumerate(flat)]
    assert protocol.steadiness(flat) == {"steady": True, "steady_reasons": []}
    verdict = protocol.steadiness(trend)
    assert verdict["steady"] is False and verdict["steady_reasons"][0].startswith("trend: ")


def test_reserved_growth_late_and_retries_on_most_steps_are_flagged():
    rows = [{"step_time_s": 1.0, "peak_reserved_bytes": 10**9 + (i >= 18) * 10**8, "alloc_retries": i % 3 != 0}
            for i in range(21)]
    names = [reason.partition(":")[0] for reason in protocol.steadiness(rows)["steady_reasons"]]
    assert names == ["reserved", "retries"]
    early_growth = [{**row, "peak_reserved_bytes": 10**9 + (i >= 3) * 10**8, "alloc_retries": 0}
                    for i, row in enumerate(rows)]
    assert protocol.steadiness(early_growth)["steady"] is True  # grew before the last third, then held


def test_too_few_steps_are_not_judged():
    verdict = protocol.steadiness([{"step_time_s": 1.0}] * 3)
    assert verdict["steady"] is None and verdict["steady_reasons"][0].startswith("few steps: 3 ")


def test_the_median_interval_covers_the_true_median_in_at_least_90_percent_of_samples():
    covered = 0
    for seed in range(200):
        sample = np.random.default_rng(seed).lognormal(mean=0.0, sigma=0.1, size=20)  # true median: 1
        low, high = median_interval(sample, resamples=2000)
        covered += low <= 1.0 <= high
    assert covered >= 180


def test_the_ratio_interval_of_two_identical_arms_holds_1_and_a_real_difference_excludes_it():
    rng = np.random.default_rng(7)
    runs = [rng.lognormal(0.0, 0.05, 20) for _ in range(3)]
    same = ratio_interval(runs, runs)
    assert same.low < 1 < same.high and same.verdict == "no difference" and same.sizes == "3×20 / 3×20"
    faster = ratio_interval([run * 0.8 for run in runs], runs)
    assert faster.high < 1 and faster.verdict == "faster" and faster.ratio == pytest.approx(0.8)
    assert faster.text().startswith("0.800× [")


def test_intervals_are_reproducible_and_widen_with_run_to_run_spread():
    rng = np.random.default_rng(3)
    runs = [rng.normal(1.0, 0.01, 20) for _ in range(3)]
    assert runs_interval(runs) == runs_interval(runs)
    drifting = [run + offset for run, offset in zip(runs, (0.0, 0.05, 0.10))]
    width = lambda interval: interval[1] - interval[0]  # noqa: E731
    assert width(runs_interval(drifting)) > 3 * width(runs_interval(runs))
    assert runs_interval([[1.0]]) is None and ratio_interval([[1.0]], runs) is None


def test_the_machine_reading_degrades_to_not_available_without_a_gpu():
    reading = machine.reading(None)
    assert reading["gpu"] == {"available": False, "why": "no GPU"}
    assert reading["host"]["cpus"] >= 1 and reading["host"]["load_1min"] >= 0
    missing = machine.gpu_reading("GPU-00000000-0000-0000-0000-000000000000")  # no NVML library, or no such GPU
    assert missing["available"] is False and missing["why"]
    assert machine.flags([reading], [reading], [123]) == []


def gpu(clock=1980, slowdowns=(), processes=(), uuid="GPU-a"):
    return {"gpu": {"available": True, "uuid": uuid, "sm_clock_mhz": clock, "slowdowns": list(slowdowns),
                    "processes": [{"pid": pid, "used_bytes": used} for pid, used in processes]}, "host": {}}


def test_machine_flags_name_a_clock_drop_a_slowdown_and_a_neighbour():
    mine = (10, 5 * 10**9)
    start, end = [gpu(processes=[mine])], [gpu(clock=1500, slowdowns=["hw_thermal"], processes=[mine, (99, 2e9)])]
    names = [flag.partition(":")[0] for flag in machine.flags(start, end, own_pids=[10])]
    assert names == ["clock", "slowdown", "neighbour"]
    assert machine.flags([gpu(processes=[mine])], [gpu(clock=1900, processes=[mine])], [10]) == []
    # inside a container NVML lists the host's pids: as many processes as ranks on the GPU is no neighbour
    assert machine.flags([gpu(processes=[(4242, 5e9)])], [gpu(processes=[(4242, 5e9)])], own_pids=[10]) == []
