"""deepcompile: DeepCompile without offload; the offload benchmark's reference."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

from harness.arms.base import BenchRole, CompiledArm, Display, gather_release


@dataclass(frozen=True)
class DeepCompile(CompiledArm):
    # default: gather/release, then prefetch + selective gather from DeepCompile's warm-up; z3_only: gather/release
    schedule: Literal["default", "z3_only"]

    bench_role: ClassVar[str] = BenchRole.REFERENCE
    display: ClassVar[Display] = Display("DeepCompile", "#E69F00", "s", table_order=1, capacity_order=2)

    def compile_schedule(self, cfg: Mapping[str, Any], engine, budget_bytes: int | None, run_dir: str) -> list:
        if self.schedule == "z3_only":
            return [(0, [gather_release()])]
        from deepspeed.compile.init_z3 import WARMUP
        from deepspeed.compile.passes import prefetch, selective_gather

        return [(0, [gather_release()]),
                (WARMUP, [gather_release(), prefetch.schedule_prefetch, selective_gather.selective_gather])]
