"""offload: our own optimizer-state offload pass (harness/offload/); its knobs live in the offload group."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ClassVar, Mapping

from harness.contract import schema
from harness.arms.base import BenchRole, Display, OffloadPassArm


@dataclass(frozen=True)
class Offload(OffloadPassArm):
    bench_role: ClassVar[str] = BenchRole.OURS
    display: ClassVar[Display] = Display("ours", "#D55E00", "D", table_order=3, capacity_order=4)
    offload_keys: ClassVar[tuple[str, ...]] = tuple(field.name for field in fields(schema.OffloadConfig))  # all

    @classmethod
    def idle_offload_keys(cls, offload: Mapping[str, Any]) -> tuple[str, ...]:
        """`auto_rule` picks the plan only without a budget; `budget_rule` sizes a budget, which the device rule
        does without. Keys missing from `offload` (runs recorded before them) read as null."""
        from harness import offload as our_pass

        values = {key: offload.get(key) for key in cls.offload_keys}
        if schema.budget_given(values):
            return ("auto_rule",)
        return ("budget_rule",) if our_pass.uses_device_rule(values) else ()

    def check(self, config: schema.Config) -> None:
        from harness import offload

        super().check(config)
        offload.check_config(self.deepspeed_config(config, cuda=True), asdict(config.offload))

    def phase_start_steps(self, config: schema.Config) -> list[int]:
        from harness.offload import PLANNING_STEP

        return [0, PLANNING_STEP]

    def compile_schedule(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list:
        from harness import offload

        return offload.install(engine, asdict(config.offload), budget_bytes, run_dir,
                               copy_delay_us=config.debug.copy_delay_us)

    def offload_counter_reader(self) -> Callable[[], dict]:
        from harness import offload

        return offload.counters

    def observe_step(self, record: Mapping[str, Any]) -> None:
        from harness import offload

        offload.observe_step(dict(record))

    def plan_facts(self) -> dict[str, int]:
        from harness import offload

        return offload.plan_facts()

    def pass_seconds(self) -> float | None:
        from harness import offload

        return offload.pass_seconds()
