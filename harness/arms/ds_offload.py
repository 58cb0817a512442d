"""ds_offload: DeepSpeed's built-in optimizer-state offload pass (compile.offload_opt_states, PR #8186), planned
against the same budget in bytes as our pass.

Gradient accumulation runs as DeepSpeed ships it: DeepSpeed accepts it (its only refusals of this pass are
ZeRO-Offload and activation or parameter offload alongside it) and documents the pass as "designed for
gradient_accumulation_steps=1: the compiled graph runs once per micro-batch, so accumulation repeats the whole
offload/reload cycle" (compile.offload_opt_states). Its ops carry no boundary check, so the states go out and come
back once per micro-batch; `offload_cycles` counts that."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal

from harness.arms.base import BenchRole, Display, OffloadPassArm, gather_release
from harness.contract import schema
from harness.contract.units import GB


@dataclass(frozen=True)
class DsOffload(OffloadPassArm):
    # async: planned against the budget; sync (offload_adam_states_sync): all out, all back, blocking
    variant: Literal["async", "sync"]

    bench_role: ClassVar[str] = BenchRole.PEER
    display: ClassVar[Display] = Display("DeepSpeed offload", "#009E73", "^", table_order=2, capacity_order=3)

    def deepspeed_config(self, config: schema.Config, cuda: bool) -> dict:
        ds = super().deepspeed_config(config, cuda)
        ds["compile"]["offload_opt_states"] = True
        return ds

    def phase_start_steps(self, config: schema.Config) -> list[int]:
        return [0, 1]  # DeepSpeed's pass evicts, profiles and plans at step 1, once step 0 made the states

    def compile_schedule(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list:
        from deepspeed.compile.passes import offload_adam_states as ds_pass

        # DeepSpeed's pass reads its budget from this hook; both passes plan against the same bytes.
        os.environ["DS_DC_OFFLOAD_OPT_BUDGET_GB"] = repr(budget_bytes / GB)
        if self.variant == "sync":
            return [(0, [gather_release()]), (1, [gather_release(), ds_pass.move_opt_states_sync])]
        # States exist after step 0's optimizer step: evict them, profile on the emptied GPU, plan.
        return [(0, [gather_release()]),
                (1, [ds_pass.offload_adam_states_for_init, gather_release(), ds_pass.move_opt_states])]

    def offload_counter_reader(self) -> Callable[[], dict]:
        return _op_counters if self.variant == "async" else _sync_counters

    def plan_facts(self) -> dict[str, int]:
        from deepspeed.compile.passes import offload_adam_states as ds_pass

        return {"planned_offload_bytes": int(sum(task[3] for task in ds_pass.offload_tasks_scheduled))}


def _op_counters() -> dict:
    """DeepSpeed's op stats: one launch and one reload per scheduled state each time its graphs run. A cycle (all
    scheduled states out and back) is therefore as many launches as states are scheduled; floor division keeps a
    steady step's delta exact whatever the compile step's profiling runs added."""
    from deepspeed.compile.passes import offload_adam_states as ds_pass

    stats = ds_pass.get_offload_op_stats()
    launches, scheduled = stats.get("launches", 0), len(ds_pass.offload_tasks_scheduled)
    return {"offload_launches": launches, "reloads": stats.get("reloads", 0),
            "offload_cycles": launches // scheduled if scheduled else 0}


def _sync_counters() -> dict:
    """The sync variant moves every state in Python functions its op stats do not count: its cycles stay None."""
    return {key: value for key, value in _op_counters().items() if key != "offload_cycles"}
