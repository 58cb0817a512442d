"""The dry run's memory estimate (estimate_only=true): points, GPUs, model-state bytes per rank; nothing launched."""
import re
import subprocess
import sys

import pytest

from harness import arms
from harness.driver import estimate
from harness.contract.errors import ConfigError


def estimate_cmd(*flags: str) -> list[str]:
    return [sys.executable, "-m", "harness.run", "-m", "experiments=pr8186_table", "launcher=slurm",
            "launcher.gpu_memory_gb=20", *flags]


def test_zero3_state_bytes_per_rank():
    n = 14_768_307_200  # Qwen3-14B (test_config checks the preset's count)
    states = estimate.model_state_bytes(n, 8, "bf16")
    assert states["optimizer"] == pytest.approx(22.2e9, rel=0.02)  # PR #8186: fp32 states 22.2 GB per rank
    assert states["params"] == states["grads"] == states["optimizer"] / 6
    assert estimate.model_state_bytes(n, 8, "fp32")["optimizer"] == 2 * states["params"] * 2  # no master copy
    arm = arms.registered()
    assert estimate.states_on_gpu(arm["zero3"], states) == sum(states.values())
    assert estimate.states_on_gpu(arm["zero_offload"], states) == estimate.states_on_gpu(arm["ds_offload"], states) \
        == states["params"] + states["grads"]


@pytest.mark.slow
def test_estimate_only_prints_the_pr8186_sweep_and_launches_nothing(tmp_path):
    proc = subprocess.run(estimate_cmd("estimate_only=true"), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no run dir, no sweep dir, nothing recorded
    assert proc.stdout.startswith("estimate: 18 points, 8 GPUs each (144 GPUs in all")
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s", line)]
    assert len(rows) == 9 * 2
    seen = set()
    for index, gpus, nodes, params, grads, optim, on_gpu, fits, *point in rows:
        assert (gpus, nodes) == ("8", "1")
        assert float(optim) * 1e9 == pytest.approx(22.2e9, rel=0.02)
        assert float(params) == float(grads) == pytest.approx(float(optim) / 6, abs=0.01)
        row = point[0].split("=")[1]
        keeps_optimizer = row in ("zero3", "dc_z3_only", "dc_default")
        assert float(on_gpu) == pytest.approx(float(params) + float(grads) + keeps_optimizer * float(optim), abs=0.02)
        assert fits == ("NO" if keeps_optimizer else "yes")  # 29.5 GB of model states > 20 GB
        seen.add((row, point[1]))
    assert {seq for _, seq in seen} == {"train.seq_len=2048", "train.seq_len=2400"} and len(seen) == 18


@pytest.mark.slow
def test_the_old_flag_is_refused_in_one_line_naming_the_new_one(tmp_path):
    proc = subprocess.run(estimate_cmd("plan_only=true"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["config error: plan_only: renamed: use estimate_only=true "
                                                "(the sweep's memory estimate)"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,wanted", [(["estimate_only=true"], True), (["train.steps=2"], False),
                                         (["-m", "estimate_only=false"], False)])
def test_the_estimate_is_asked_for_only_by_its_flag(args, wanted):
    assert estimate.requested(args) is wanted


@pytest.mark.parametrize("old", ["plan_only=true", "plan_only=false", "+plan_only=true"])
def test_every_form_of_the_old_flag_is_refused(old):
    with pytest.raises(ConfigError) as error:
        estimate.requested(["-m", old])
    assert error.value.key == "plan_only" and "estimate_only=true" in str(error.value)
