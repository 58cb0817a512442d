"""Arms: an arm name -> its DeepSpeed config, its compile schedule, what it needs, its offload counters.

Every arm trains the same model with ZeRO-3; they differ only in how (eager, compiled) and where the
optimizer state lives. Compiled arms build their schedule here and hand it to `engine.compile`, so
the worker knows the exact steps where DeepCompile recompiles (the phase boundaries).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from harness.errors import ConfigError

DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class ArmSpec:
    name: str
    needs_cuda: bool
    compiled: bool
    offloads_opt_states: bool  # plans against the shared offload budget


ARMS: dict[str, ArmSpec] = {
    "zero3": ArmSpec("zero3", needs_cuda=False, compiled=False, offloads_opt_states=False),
    "zero_offload": ArmSpec("zero_offload", needs_cuda=False, compiled=False, offloads_opt_states=False),
    "deepcompile": ArmSpec("deepcompile", needs_cuda=True, compiled=True, offloads_opt_states=False),
    "ds_offload": ArmSpec("ds_offload", needs_cuda=True, compiled=True, offloads_opt_states=True),
    "offload": ArmSpec("offload", needs_cuda=True, compiled=True, offloads_opt_states=True),
}


def arm_spec(name: str) -> ArmSpec:
    if name not in ARMS:
        raise ConfigError("arm.name", f"unknown arm {name!r}; expected one of {sorted(ARMS)}")
    return ARMS[name]


def deepspeed_config(cfg: Mapping[str, Any], cuda: bool) -> dict:
    """The DeepSpeed config dict of one point (ZeRO-3 for every arm)."""
    train, arm = cfg["train"], cfg["arm"]
    torch_adam = train["torch_adam"] if train["torch_adam"] is not None else not cuda
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": train["micro_batch"],
        "gradient_accumulation_steps": train["grad_accum"],
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": train["lr"], "torch_adam": torch_adam}},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    for key in ("sub_group_size", "reduce_bucket_size"):  # null: DeepSpeed's default
        if train[key] is not None:
            ds["zero_optimization"][key] = int(train[key])
    if train["dtype"] == "bf16":
        ds["bf16"] = {"enabled": True}
    elif train["dtype"] == "fp16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if arm.get("offload_optimizer") == "cpu":
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
        ds["optimizer"]["params"]["torch_adam"] = False  # ZeRO-Offload's point is DeepSpeed's CPU Adam
    if arm_spec(arm["name"]).compiled:
        ds["compile"] = {"deepcompile": True, "offload_opt_states": arm["name"] == "ds_offload"}
    return ds


def check_arm_config(cfg: Mapping[str, Any]) -> None:
    """Arm knobs that cannot work together with the rest of the config (validate has checked each value
    alone); raises ConfigError naming the key."""
    arm = cfg["arm"]
    spec = arm_spec(arm["name"])
    if spec.offloads_opt_states and arm.get("offload_optimizer") == "cpu":
        raise ConfigError("arm.offload_optimizer", f"{arm['name']} moves optimizer states itself; "
                          "it cannot be combined with ZeRO-Offload (offload_optimizer=cpu)")
    if arm["name"] == "ds_offload" and cfg["train"]["grad_accum"] != 1:
        raise ConfigError("train.grad_accum", "ds_offload (DeepSpeed's pass) supports gradient_accumulation_steps=1 only")
    if not spec.compiled:
        check_phase_starts(arm.get("phase_starts") or [0])
    if arm["name"] == "offload":
        from harness import offload
        offload.check_config(deepspeed_config(cfg, cuda=True), dict(cfg["offload"]), cfg["train"]["grad_accum"])


def check_phase_starts(starts: Any) -> None:
    steps_ok = isinstance(starts, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in starts)
    if not steps_ok or starts[0] != 0 or sorted(set(starts)) != starts:
        raise ConfigError("arm.phase_starts", f"must be a list of steps that starts at 0 and increases strictly, got {starts!r}")


def compile_schedule(cfg: Mapping[str, Any], engine, budget_bytes: int | None, run_dir: str) -> list | None:
    """The schedule handed to engine.compile for a compiled arm; None for eager arms."""
    name = cfg["arm"]["name"]
    if not arm_spec(name).compiled:
        return None
    from deepspeed.compile.init_z3 import WARMUP
    from deepspeed.compile.passes import prefetch, selective_gather, zero3_compile

    gather_release = zero3_compile.add_z3_gather_release
    if name == "deepcompile":
        if cfg["arm"]["schedule"] == "z3_only":
            return [(0, [gather_release])]
        return [(0, [gather_release]),
                (WARMUP, [gather_release, prefetch.schedule_prefetch, selective_gather.selective_gather])]
    if name == "ds_offload":
        from deepspeed.compile.passes import offload_adam_states as ds_pass
        # DeepSpeed's pass reads its budget from this hook; both passes plan against the same bytes.
        os.environ["DS_DC_OFFLOAD_OPT_BUDGET_GB"] = repr(budget_bytes / 1e9)
        if cfg["arm"]["variant"] == "sync":
            return [(0, [gather_release]), (1, [gather_release, ds_pass.move_opt_states_sync])]
        # States exist after step 0's optimizer step: evict them, profile on the emptied GPU, plan.
        return [(0, [gather_release]),
                (1, [ds_pass.offload_adam_states_for_init, gather_release, ds_pass.move_opt_states])]
    from harness import offload
    return offload.install(engine, dict(cfg["offload"]), budget_bytes, run_dir,
                           copy_delay_us=cfg["debug"].get("copy_delay_us", 0))


def phase_starts(cfg: Mapping[str, Any], schedule: list | None) -> list[int]:
    """Steps where a phase begins: the schedule's entries for compiled arms, else the arm's markers."""
    if schedule is not None:
        return [step for step, _ in schedule]
    return list(cfg["arm"].get("phase_starts") or [0])


def offload_counter_reader(name: str) -> Callable[[], dict] | None:
    """A function returning the arm's cumulative offload counters, or None for arms without them."""
    if name == "offload":
        from harness import offload
        return offload.counters
    if name == "ds_offload":
        return _ds_offload_counters
    return None


def _ds_offload_counters() -> dict:
    from deepspeed.compile.passes import offload_adam_states as ds_pass
    stats = ds_pass.get_offload_op_stats()
    return {"offload_launches": stats.get("launches", 0), "reloads": stats.get("reloads", 0)}


def predicted_peak_bytes(name: str) -> int | None:
    """The peak allocated bytes of a step that the arm's last plan predicts (None for arms without a prediction)."""
    if name == "offload":
        from harness import offload
        return offload.predicted_peak_bytes()
    return None


def planned_offload_bytes(name: str) -> int | None:
    """Optimizer-state bytes the arm's last plan moves off the device (None for arms without a plan)."""
    if name == "ds_offload":
        from deepspeed.compile.passes import offload_adam_states as ds_pass
        return int(sum(task[3] for task in ds_pass.offload_tasks_scheduled))
    if name == "offload":
        from harness import offload
        return offload.planned_offload_bytes()
    return None
