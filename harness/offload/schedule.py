"""The capacity-first compile schedule and the contracts our passes register under.

Phase 0 (steps 0 and 1): ZeRO-3 gather/release only; the optimizer states come to exist at step 0's optimizer
step. Step 1 runs the compiled graphs as they are: its memory peaks (the worker's segment peaks, passed on through
`offload.observe_step`) correct the profile's (profile.calibrate).
Phase 1 (step 2): evict every state, then gather/release (which profiles the graph, now on the emptied device),
then our planning pass. With `offload.compose`, DeepCompile's prefetch (and selective gather) run in that entry
between gather/release and our plan, as DeepCompile's default schedule runs them after gather/release: both read
the profile gather/release made and DeepCompile re-profiles each graph after them, and our plan, last, sees what
they hold. Our snapshot pass right before them keeps the profile and the allocator's reading without them
(graph_pass.OffloadPass.before_compose). DeepCompile recompiles from the captured graph at each entry, so
gather/release is listed again. Entries name passes by their registered names, which DeepCompile validates against the
contracts before it resolves them to functions.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

from deepspeed.compile.passes.contract import CAP_OPT_STATES_EVICTED, CAP_Z3_GATHER_RELEASE, PassContract

from harness.offload import PLANNING_STEP
from harness.offload.graph_pass import OffloadPass

EVICT_PASS = "offload_harness_evict"
PLAN_PASS = "offload_harness_plan"
SNAPSHOT_PASS = "offload_harness_before_compose"
# DeepSpeed's registered names (deepspeed.compile.passes.prefetch.NAME, selective_gather.NAME): the engine
# registers both with their contracts, each requiring gather/release earlier in the same entry.
COMPOSED_PASSES = {"none": [], "prefetch": ["prefetch"], "prefetch_selective_gather": ["prefetch", "selective_gather"]}
GATHER_RELEASE_PASS = "zero3_compile"  # deepspeed.compile.passes.zero3_compile.NAME

# DeepSpeed's own passes that move the same optimizer states, or plan other offloads against the same budget.
_EXCLUSIVE = frozenset({
    "offload_adam_states", "offload_adam_states_sync", "offload_adam_states_for_init",
    "offload_parameters", "offload_activation", "offload_activation_floor",
})

EVICT_CONTRACT = PassContract(provides=frozenset({CAP_OPT_STATES_EVICTED}), conflicts_with=_EXCLUSIVE, phase="fwd")
# The plan is only as good as a profile taken after eviction and after the gather/release ops are in place.
PLAN_CONTRACT = PassContract(requires=frozenset({CAP_OPT_STATES_EVICTED, CAP_Z3_GATHER_RELEASE}),
                             conflicts_with=_EXCLUSIVE, phase="both")
SNAPSHOT_CONTRACT = PassContract(requires=frozenset({CAP_OPT_STATES_EVICTED, CAP_Z3_GATHER_RELEASE}), phase="both")


def build_schedule(compose: str = "none") -> list[tuple[int, list[str]]]:
    composed = COMPOSED_PASSES[compose]
    snapshot = [SNAPSHOT_PASS] if composed else []
    return [
        (0, [GATHER_RELEASE_PASS]),
        (PLANNING_STEP, [EVICT_PASS, GATHER_RELEASE_PASS, *snapshot, *composed, PLAN_PASS]),
    ]


def phase_at(schedule: list[tuple[int, list]], global_step: int) -> int:
    """Index of the schedule entry in force at this optimizer step."""
    return max(index for index, (step, _) in enumerate(schedule) if step <= global_step)


def register_passes(engine, offload_pass: OffloadPass) -> None:
    engine.register_compile_pass(EVICT_PASS, _timed(offload_pass, offload_pass.evict), EVICT_CONTRACT)
    engine.register_compile_pass(PLAN_PASS, _timed(offload_pass, offload_pass.plan), PLAN_CONTRACT)
    engine.register_compile_pass(SNAPSHOT_PASS, _timed(offload_pass, offload_pass.before_compose), SNAPSHOT_CONTRACT)


def _timed(offload_pass: OffloadPass, run: Callable) -> Callable:
    """The pass, its seconds added to offload_pass.pass_seconds (the worker's wall split reads them)."""
    @functools.wraps(run)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            offload_pass.pass_seconds += time.perf_counter() - start

    return timed
