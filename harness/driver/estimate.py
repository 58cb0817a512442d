"""The dry run before a sweep (`estimate_only=true` on harness.run's command line): every point, the GPUs it needs
and the per-rank model-state memory of its model preset at its world size, against the device; nothing is
launched or recorded. Activations are not included, so a point that fits here may still run out of memory.

    python -m harness.run -m experiments=pr8186_table estimate_only=true
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping

from harness import arms
from harness.driver import console
from harness.config.compose import compose_point, sweep_points
from harness.contract import schema
from harness.contract.errors import ConfigError
from harness.contract.units import GB

ESTIMATE_ONLY = "estimate_only=true"  # on harness.run's command line: print the estimate instead of running
RENAMED_FLAG = "plan_only"  # the flag's old name, refused: "plan" is the offload planner's (harness plan, plan.json)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAM_MOMENT_BYTES = 8  # exp_avg + exp_avg_sq, fp32


def requested(args: list[str]) -> bool:
    """Whether harness.run's command line asks for the estimate only; the flag's old name is refused."""
    if any(arg.lstrip("+~").split("=", 1)[0] == RENAMED_FLAG for arg in args):
        raise ConfigError(RENAMED_FLAG, f"renamed: use {ESTIMATE_ONLY} (the sweep's memory estimate)")
    return ESTIMATE_ONLY in args


def model_state_bytes(n_params: int, world_size: int, dtype: str) -> dict[str, int]:
    """Per-rank bytes of ZeRO-3's partitioned model states: parameters and gradients in the training dtype,
    and the optimizer state (an fp32 master copy unless training in fp32, plus Adam's two fp32 moments)."""
    shard = -(-n_params // world_size)  # ceil: ZeRO-3 pads partitions up
    master = 0 if dtype == "fp32" else 4
    return {"params": shard * DTYPE_BYTES[dtype], "grads": shard * DTYPE_BYTES[dtype],
            "optimizer": shard * (master + ADAM_MOMENT_BYTES)}


def states_on_gpu(arm: arms.Arm, states: Mapping[str, int]) -> int:
    """Model-state bytes that must stay on the GPU: parameters and gradients, and the optimizer state unless the
    arm keeps it elsewhere (ZeRO-Offload on the CPU; the offload arms can move all of it out)."""
    keeps_optimizer = arm.keeps_optimizer_states_on_gpu
    return states["params"] + states["grads"] + (states["optimizer"] if keeps_optimizer else 0)


@lru_cache(maxsize=None)
def _parameter_count(model_json: str) -> int:
    from harness.rank.models import count_parameters

    return count_parameters(json.loads(model_json))


def _device_memory_bytes(config: schema.Config) -> int | None:
    """What a point's ranks may use: the emulated device size if set, else launcher.gpu_memory_gb, else this GPU."""
    emulated = config.env.device_memory_gb
    if emulated is not None:
        return int(emulated * GB)
    if config.launcher.gpu_memory_gb:
        return int(config.launcher.gpu_memory_gb * GB)
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def estimate_row(overrides: list[str]) -> dict[str, Any]:
    """One point of the estimate: its GPUs and per-rank model-state bytes, or the config error it would hit."""
    from omegaconf import OmegaConf

    from harness.driver.validate import validate

    config = OmegaConf.to_container(compose_point(overrides), resolve=True)
    launcher = config["launcher"]  # not validated yet: the row of a refused point names what it can
    row: dict[str, Any] = {"overrides": overrides, "arm": config["arm"]["name"], "model": config["model"]["name"],
                           "nnodes": launcher["nnodes"], "nproc_per_node": launcher["nproc_per_node"],
                           "gpus": launcher["nnodes"] * launcher["nproc_per_node"], "error": None}
    try:
        typed = validate(config, gpu_count=None)
    except ConfigError as error:
        return {**row, "error": str(error)}
    n_params = _parameter_count(json.dumps(config["model"], sort_keys=True))  # the model's builder reads the dict
    states = model_state_bytes(n_params, row["gpus"], typed.train.dtype)
    memory = _device_memory_bytes(typed)
    on_gpu = states_on_gpu(typed.arm, states)
    return {**row, **states, "n_params": n_params, "on_gpu": on_gpu, "gpu_memory": memory,
            "fits": None if memory is None else on_gpu <= memory}


def _varying(points: list[list[str]]) -> list[list[str]]:
    """The overrides that tell points apart (all of them for a single point)."""
    if len(points) < 2:
        return points
    common = set.intersection(*(set(p) for p in points))
    return [[o for o in p if o not in common] for p in points]


def format_estimate(rows: list[dict[str, Any]], labels: list[list[str]]) -> str:
    gpus = sorted({r["gpus"] for r in rows})
    memory = next((r["gpu_memory"] for r in rows if r.get("gpu_memory")), None)
    limit = f"{memory / GB:.1f} GB per GPU" if memory else "? (set launcher.gpu_memory_gb)"
    lines = [f"estimate: {len(rows)} points, {'/'.join(map(str, gpus))} GPUs each"
             f" ({sum(r['gpus'] for r in rows)} GPUs in all if they ran at once); nothing is launched or recorded.",
             "per rank, GB = 1e9 bytes: ZeRO-3 shards of the parameters and gradients (training dtype) and of the",
             "optimizer state (fp32 master + 2 Adam moments); 'on GPU' = the model states that must stay on the",
             f"device (activations not included); 'fits' = on GPU <= {limit}.",
             f"{'#':>3} {'GPUs':>4} {'nodes':>5} {'params':>7} {'grads':>7} {'optim':>7} {'on GPU':>7}"
             f" {'fits':>4}  point"]
    for i, (row, label) in enumerate(zip(rows, labels)):
        point = " ".join(label)
        if row["error"]:
            lines.append(f"{i:>3} {row['gpus']:>4} {row['nnodes']:>5} {'config error: ' + row['error']}  {point}")
            continue
        fits = "?" if row["fits"] is None else ("yes" if row["fits"] else "NO")
        lines.append(f"{i:>3} {row['gpus']:>4} {row['nnodes']:>5} {row['params'] / GB:>7.2f} {row['grads'] / GB:>7.2f}"
                     f" {row['optimizer'] / GB:>7.2f} {row['on_gpu'] / GB:>7.2f} {fits:>4}  {point}")
    return "\n".join(lines)


def print_estimate(overrides: list[str], multirun: bool) -> None:
    """Print every point of the sweep with its GPUs and per-rank memory; launch nothing."""
    points = sweep_points(overrides, multirun)
    console.out(format_estimate([estimate_row(point) for point in points], _varying(points)))
