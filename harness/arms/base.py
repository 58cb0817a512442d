"""The Arm base classes: what every arm shares (ZeRO-3, its DeepSpeed config, its checks) and the defaults of
its traits; one module per arm beside this one subclasses them.

An arm's knobs are the dataclass fields (the keys of conf/arm/NAME.yaml), typed as the config schema reads them
(harness/contract/schema/fields.py); its traits are class attributes, read by the driver (what it needs), the dry-run
memory estimate, `harness bench` and analysis (how it is shown).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Optional

from harness.contract import schema
from harness.contract.errors import ConfigError

OTHER_ORDER = 1000  # arms without a place in a fixed order come after those with one


class BenchRole:
    """What an arm is in `harness bench` (the offload benchmark)."""
    OURS = "ours"            # the pass measured: its offload knobs label it, its step time is each ratio's numerator
    PEER = "peer"            # the other offload pass, the first ratio's base
    REFERENCE = "reference"  # no offload: in every budget's group, the losses' reference, the last ratio's base


@dataclass(frozen=True)
class Display:
    """How readers see an arm: its name in papers, its colour and marker in every figure (Okabe-Ito, colour-blind
    safe, for the arms here; grey for an arm without its own), and where its rows go in the tables."""
    name: str | None = None  # None: the arm's config name
    colour: str = "#7F7F7F"
    marker: str = "x"
    table_order: int = OTHER_ORDER  # rows of the throughput, memory, policy and budget tables
    capacity_order: int = OTHER_ORDER  # rows of the capacity table (PR #8186's order)


@dataclass(frozen=True)
class Arm:
    """One way to train the same model with ZeRO-3."""
    name: str
    offload_optimizer: Optional[Literal["cpu"]]  # cpu: ZeRO-Offload (the optimizer and its states on the host)

    needs_cuda: ClassVar[bool] = False
    offloads_opt_states: ClassVar[bool] = False  # moves optimizer states off the device within the offload budget
    keeps_optimizer_states_on_gpu: ClassVar[bool] = True  # the dry-run memory estimate counts them on the device
    baseline: ClassVar[bool] = False  # the arm speed-ups are measured against
    bench_role: ClassVar[str | None] = None  # a BenchRole, for arms `harness bench` compares
    display: ClassVar[Display] = Display()
    # The keys of the offload group the arm reads (every config has that group); the others do nothing to it, so
    # analysis neither labels the arm's points by them nor tells its points apart by them.
    offload_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, arm_cfg: Mapping[str, Any]) -> Arm:
        """The arm of a config's arm group; keys other than its knobs are left to the validation."""
        knobs = {}
        for field in fields(cls):
            if field.name not in arm_cfg:
                raise ConfigError(f"arm.{field.name}", "missing")
            knobs[field.name] = arm_cfg[field.name]
        return cls(**knobs)

    def deepspeed_config(self, config: schema.Config, cuda: bool) -> dict:
        """The DeepSpeed config dict of one point (ZeRO-3 for every arm)."""
        train = config.train
        torch_adam = train.torch_adam if train.torch_adam is not None else not cuda
        ds: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": train.micro_batch,
            "gradient_accumulation_steps": train.grad_accum,
            "zero_optimization": {"stage": 3},
            "optimizer": {"type": "AdamW", "params": {"lr": train.lr, "torch_adam": torch_adam}},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        for key, size in (("sub_group_size", train.sub_group_size), ("reduce_bucket_size", train.reduce_bucket_size)):
            if size is not None:  # null: DeepSpeed's default
                ds["zero_optimization"][key] = int(size)
        if train.dtype == "bf16":
            ds["bf16"] = {"enabled": True}
        elif train.dtype == "fp16":
            ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
        if self.offload_optimizer == "cpu":
            ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
            ds["optimizer"]["params"]["torch_adam"] = False  # ZeRO-Offload's point is DeepSpeed's CPU Adam
        return ds

    def check(self, config: schema.Config) -> None:
        """Knobs that cannot work together with the rest of the config (the validation has checked each value
        alone); raises ConfigError naming the key."""

    def phase_start_steps(self, config: schema.Config) -> list[int]:
        """The steps where the arm's phases begin, known before launch: the measurement protocol counts the steps
        a point runs from the last of them (harness/contract/protocol.py)."""
        return [0]

    def compile(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list[int]:
        """Compile the engine if the arm does; returns the steps where phases begin."""
        return self.phase_start_steps(config)

    def offload_counter_reader(self) -> Callable[[], dict] | None:
        """A function returning the arm's cumulative offload counters, or None for arms without them."""
        return None

    def observe_step(self, record: Mapping[str, Any]) -> None:
        """A finished step's record (all ranks' aggregate), for arms whose planning measures the running step."""

    def pass_seconds(self) -> float | None:
        """Seconds the arm's own compile passes have taken so far (worker.json's wall_split); None for arms
        without passes of their own."""
        return None

    def plan_facts(self) -> dict[str, int]:
        """What the arm's last offload plan says, for worker.json: `planned_offload_bytes` (optimizer-state bytes
        moved off the device), and where the arm predicts them `predicted_peak_bytes` and `budget_bytes` (what it
        planned against); {} for arms without a plan."""
        return {}

    @classmethod
    def idle_offload_keys(cls, offload: Mapping[str, Any]) -> tuple[str, ...]:
        """Of `offload_keys`, those that these values of the offload group leave without effect (a rule that only
        applies without a budget, when one is given): none here."""
        return ()


class PhaseStarts:
    """Steps where phases begin: a list that starts at 0 and increases strictly (null or empty: one phase)."""

    def check(self, key: str, value: Any) -> None:
        starts = value or [0]
        steps_ok = isinstance(starts, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in starts)
        if not steps_ok or starts[0] != 0 or sorted(set(starts)) != starts:
            raise ConfigError(key, f"must be a list of steps that starts at 0 and increases strictly, got {starts!r}")


@dataclass(frozen=True)
class EagerArm(Arm):
    """No compile: one phase, unless `phase_starts` marks more (e.g. to compare warm-up)."""
    phase_starts: Annotated[Optional[list], PhaseStarts()]

    def phase_start_steps(self, config: schema.Config) -> list[int]:
        return list(self.phase_starts or [0])


@dataclass(frozen=True)
class CompiledArm(Arm):
    """DeepCompile: the arm's compile schedule goes to `engine.compile`; its entries are the phase boundaries
    (DeepCompile recompiles at each)."""
    compile_backend: Literal["inductor", "eager"]

    needs_cuda: ClassVar[bool] = True

    def deepspeed_config(self, config: schema.Config, cuda: bool) -> dict:
        ds = super().deepspeed_config(config, cuda)
        ds["compile"] = {"deepcompile": True, "offload_opt_states": False}
        return ds

    def compile(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list[int]:
        schedule = self.compile_schedule(config, engine, budget_bytes, run_dir)
        starts = [step for step, _ in schedule]
        if starts != self.phase_start_steps(config):  # the step counts were made from the declared starts
            raise RuntimeError(f"arm {self.name}: the compile schedule starts phases at {starts}, but the arm "
                               f"declares {self.phase_start_steps(config)} (phase_start_steps)")
        engine.compile(backend=self.compile_backend, schedule=schedule)
        return starts

    def compile_schedule(self, config: schema.Config, engine, budget_bytes: int | None, run_dir: str) -> list:
        """[(step, [passes]), ...]: the passes DeepCompile runs from each step on."""
        raise NotImplementedError


def gather_release():
    """DeepCompile's ZeRO-3 gather/release pass, which every compiled arm's schedule starts with."""
    from deepspeed.compile.passes import zero3_compile

    return zero3_compile.add_z3_gather_release


@dataclass(frozen=True)
class OffloadPassArm(CompiledArm):
    """DeepCompile with a pass that moves optimizer states to the host within the shared offload budget."""
    offloads_opt_states: ClassVar[bool] = True
    keeps_optimizer_states_on_gpu: ClassVar[bool] = False
    offload_keys: ClassVar[tuple[str, ...]] = tuple(field.name for field in fields(schema.BudgetConfig))  # the budget

    def check(self, config: schema.Config) -> None:
        super().check(config)
        if self.offload_optimizer == "cpu":
            raise ConfigError("arm.offload_optimizer", f"{self.name} moves optimizer states itself; "
                              "it cannot be combined with ZeRO-Offload (offload_optimizer=cpu)")
