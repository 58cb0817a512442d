"""deepcompile: DeepCompile without offload; the offload benchmark's reference."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from harness.arms.base import BenchRole, CompiledArm, Display, gather_release
from harness.contract import schema

# DeepCompile's warm-up (deepspeed.compile.init_z3.WARMUP, 5 in DeepSpeed 0.19): the default schedule adds
# prefetch and selective gather there. Declared here so the driver counts steps without importing DeepSpeed;
# CompiledArm.compile refuses a schedule that disagrees.
DEEPCOMPILE_WARMUP = 5


@dataclass(frozen=True)
class DeepCompile(CompiledArm):
    # default: gather/release, then prefetch + selective gather from DeepCompile's warm-up (step 5); z3_only:
    # gather/release only
    schedule: Literal["default", "z3_only"]

    bench_role: ClassVar[str] = BenchRole.REFERENCE
    display: ClassVar[Display] = Display("DeepCompile", "#E69F00", "s", table_order=1, capacity_order=2)

    def phase_start_steps(self, config: schema.Config) -> list[int]:
        return [0] if self.schedule == "z3_only" else [0, DEEPCOMPILE_WARMUP]

    def compile_schedule(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list:
        if self.schedule == "z3_only":
            return [(0, [gather_release()])]
        from deepspeed.compile.init_z3 import WARMUP
        from deepspeed.compile.passes import prefetch, selective_gather

        return [(0, [gather_release()]),
                (WARMUP, [gather_release(), prefetch.schedule_prefetch, selective_gather.selective_gather])]
