"""The emulated device size (env.device_memory_gb): validated before launch, applied on every rank, read by
DeepSpeed through its accelerator, and an out-of-memory point says where it ran out and by how much."""
import json

import pytest

from conftest import harness_run, read_run
from harness.contract.schema.groups import check_emulated_size
from harness.rank import emulated_device
from harness.contract.errors import ConfigError

GB = 10**9


@pytest.mark.parametrize("size", [0, -1, float("nan"), float("inf"), "abc", True])
def test_a_size_must_be_a_finite_positive_number(size):
    with pytest.raises(ConfigError) as error:
        check_emulated_size(size, None, physical_bytes=None)
    assert error.value.key == "env.device_memory_gb"


def test_a_size_larger_than_the_device_is_refused_and_null_means_the_real_device():
    with pytest.raises(ConfigError) as error:
        check_emulated_size(200, None, physical_bytes=141 * GB)
    assert error.value.key == "env.device_memory_gb" and "141.00 GB" in error.value.message
    check_emulated_size(24, None, physical_bytes=141 * GB)
    check_emulated_size(None, 12, physical_bytes=141 * GB)
    assert emulated_device.size_bytes(None) is None
    assert emulated_device.size_bytes(24.5) == 24_500_000_000


def test_a_reserved_ceiling_above_the_emulated_device_is_refused():
    with pytest.raises(ConfigError) as error:
        check_emulated_size(12, 13, physical_bytes=None)
    assert error.value.key == "env.reserved_cap_gb"


def test_deepspeeds_accelerator_reports_the_emulated_size(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    for name in ("total_memory", "available_memory"):  # undone after the test
        monkeypatch.setattr(accelerator, name, getattr(accelerator, name))
    monkeypatch.setattr(accelerator, "memory_reserved", lambda device_index=None: 3 * GB)
    emulated_device.patch_accelerator(8 * GB)
    assert get_accelerator().total_memory() == 8 * GB
    assert get_accelerator().available_memory() == 5 * GB  # what the allocator does not hold yet


def test_the_allocation_an_oom_asks_for_is_read_from_cudas_message():
    message = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
               "120.01 GiB is free. Of the allocated memory 10.20 GiB is allocated by PyTorch")
    assert emulated_device.requested_bytes(message) == int(1.5 * 2**30)
    assert emulated_device.requested_bytes("CUDA out of memory (injected by debug.fault=oom)") is None


@pytest.mark.slow
def test_the_size_reaches_every_rank_and_an_oom_point_says_where(tmp_path):
    # Two ranks on CPU: no allocator to cap (one line says so), but DeepSpeed's accelerator on every rank reports
    # the emulated size; rank 1 then runs out (injected) in step 2, and the summary says so.
    proc = harness_run(tmp_path, "logger=none", "launcher.nproc_per_node=2", "env.device_memory_gb=3",
                       "debug.fault=oom", "debug.fault_step=2", "debug.fault_rank=1", "arm.phase_starts=[0,2]")
    assert proc.returncode == 1, proc.stderr[-3000:]  # recorded oom: a single point exits 0 only when ok
    run_dir = tmp_path / "run"
    rows, summary = read_run(run_dir)
    worker = json.loads((run_dir / "worker.json").read_text())
    assert worker["accelerator_total_bytes_per_rank"] == [3 * GB, 3 * GB]
    assert worker["device_memory_bytes"] == 3 * GB == worker["device_total_bytes"]
    assert "env.device_memory_gb=3: no CUDA allocator to cap" in (run_dir / "worker.log").read_text()
    assert summary["status"] == "oom" and summary["device_memory_bytes"] == 3 * GB
    assert len(rows) == 2
    oom = summary["oom"]
    assert (oom["rank"], oom["step"], oom["phase"], oom["stage"]) == (1, 2, 1, "step")
    assert "injected" in oom["message"] and oom["requested_bytes"] is None
    assert "at step 2 (phase 1)" in summary["reason"]
    assert json.loads((run_dir / "env.json").read_text())["device_memory_gb"] == 3
