"""What the ops do when they run: the policy layer between the graph ops (ops.py) and the copies (mover.py).

- mode `async`: the launch op offloads the planned states (with `launch=after_update`, each sub-group's planned
  states start out as soon as ZeRO-3 has queued its update instead, a forward earlier, so their copies are done and
  their blocks free before the forward's requests; the launch op then finds them out, unless a skipped optimizer
  step left them in); each reload op brings one back; the end-of-backward op
  brings back whatever is still out (at the compile step: the states the plan keeps resident, which the
  capacity-first eviction took out) and, unless the per-sub-group gate is installed, makes the compute stream
  wait for all reloads. With the gate, each ZeRO-3 sub-group's update waits only for its own states.
- mode `blocking`: the launch op copies every state out and waits; reload ops do nothing; the end-of-backward op
  copies every state back and waits (PR #8186's "blocking variant").
- `empty_cache`: never | once_per_phase (at the first step after a plan is made) | per_step, applied by the op
  at the head of the first forward graph.
- release ops (release=ordered or reclaimed): each sits at a site in a forward graph; the plan, made once backward
  is compiled, says which states each site releases. Ordered: the mover holds the blocks until their site, which
  frees them in stream order. Reclaimed: the blocks were freed at the launch (record_stream); the site waits on
  the host for their copies, so the allocator can hand them out at the next request.
- gradient accumulation (accumulation.py): the compiled graphs run once per micro-batch. The launch and
  empty-cache ops act only in the first micro-batch after an optimizer step, the reload and end-of-backward ops
  only in the last one, whose optimizer step reads the states; between them the states stay on the host and
  nothing is copied. Release ops free only blocks still held: after the first micro-batch, none but those the
  plan holds all step, which no site releases.
While DeepCompile profiles a graph the ops do nothing: profiling runs graphs node by node, sometimes many times.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from harness.offload import ops
from harness.offload.accumulation import MicroBatches, WholeSteps
from harness.offload.mover import StateMover, TaskSlot
from harness.offload.states import Task
from harness.contract.schema import OffloadConfig, choices

logger = logging.getLogger(__name__)

MODES = choices(OffloadConfig, "mode")
EMPTY_CACHE_POLICIES = choices(OffloadConfig, "empty_cache")


class EmptyCachePolicy:
    def __init__(self, policy: str, empty_cache: Callable[[], None]):
        if policy not in EMPTY_CACHE_POLICIES:
            raise ValueError(f"empty_cache policy must be one of {EMPTY_CACHE_POLICIES}, got {policy!r}")
        self.policy = policy
        self._empty_cache = empty_cache
        self._pending = False

    def arm(self) -> None:
        """A plan was just made: once_per_phase empties the cache at the next step start."""
        self._pending = True

    def at_step_start(self) -> None:
        if self.policy == "per_step" or (self.policy == "once_per_phase" and self._pending):
            self._pending = False
            self._empty_cache()
            ops.COUNTERS.empty_cache_calls += 1


class OffloadRuntime:
    def __init__(self, mover: StateMover, mode: str, cache_policy: EmptyCachePolicy,
                 is_profiling: Callable[[], bool] = lambda: False, micro_batches: MicroBatches = WholeSteps(),
                 reclaim_at_sites: bool = False, launch_after_update: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if launch_after_update and mode == "blocking":
            raise ValueError("launch after updates needs mode async (blocking copies all out at the launch op)")
        self.mover = mover
        self.reclaim_at_sites = reclaim_at_sites  # release=reclaimed: a site waits for its states' copies out
        self.launch_after_update = launch_after_update  # launch=after_update: out once their sub-group is updated
        self.blocking = mode == "blocking"
        self.cache_policy = cache_policy
        self.is_profiling = is_profiling
        self.micro_batches = micro_batches
        self.slots: dict[str, TaskSlot] = {}      # task id -> slot, in step order
        self.planned: frozenset[str] = frozenset()  # task ids the launch op offloads (async mode)
        self.release_sites: dict[str, tuple[str, ...]] = {}  # release op site -> task ids it releases
        self.gated = False                          # a SubGroupGate calls before_sub_group_step
        self.out_until_plan = False                 # until the first plan: states stay on the host between updates
        self._discover: Callable[[], Iterable[Task]] = lambda: ()  # the optimizer's states as they are now
        self.fallback_reloads = 0                   # states brought back outside a reload op, cumulative
        self._ends_since_plan: int | None = None    # end-of-backward runs since the plan was made
        self._warned = False                        # one warning per plan about states found out of place
        self.readings: dict[str, int] = {}          # this step's allocator reading at our ops (an arm step field)
        self.forward_start_bytes: int | None = None  # allocated at the last forward start, before its launch
        self._cycle_counted = False                 # this optimizer step's offload cycle is counted

    # ------------------------------------------------------------------ set-up (compile time)

    def adopt(self, tasks: Iterable[Task]) -> None:
        """Track these tasks, keeping the slot (and its pinned buffer) of any task seen before."""
        slots = {}
        for task in tasks:
            known = self.slots.get(task.id)
            slots[task.id] = known if known is not None and known.task.tensor is task.tensor else TaskSlot(task)
        self.slots = slots

    def evict_all(self) -> int:
        return self.mover.evict_all(self.slots.values())

    def allocator_overhead_bytes(self) -> int:
        """Empty the cache and return what the allocator still holds beyond live tensors (compile time only)."""
        device = self.mover.device
        device.empty_cache()
        return max(0, device.reserved_bytes() - device.allocated_bytes())

    def evict_from_start(self, discover: Callable[[], Iterable[Task]]) -> int:
        """Before step 0 (offload.evict_from=start): take every state off the device, so phase 0 needs no more
        memory than the planned phases; until the first plan each sub-group's states come back for its own update
        only (the gate) and go out again after it. `discover` lists the optimizer's states as they are at the
        time: Adam's moments come to exist only at the first update. Returns the bytes moved now."""
        self._discover = discover
        self.adopt(discover())
        self.out_until_plan = True
        return self.evict_all()

    def begin_phase(self) -> None:
        """New graphs are being compiled: nothing is launched until their plan is made."""
        self.planned = frozenset()
        self.release_sites = {}
        self._ends_since_plan = None

    def finalize_plan(self, offloaded: Iterable[str], release_sites: dict[str, tuple[str, ...]] | None = None,
                      ) -> None:
        """Arm the plan: the launch op offloads `offloaded`; each release site frees the states listed for it."""
        release_sites = release_sites or {}
        unknown = (set(offloaded) | {task for tasks in release_sites.values() for task in tasks}) - set(self.slots)
        if unknown:
            raise ValueError(f"plan offloads unknown tasks {sorted(unknown)}")
        self.planned = frozenset(offloaded)
        self.release_sites = dict(release_sites)
        self._ends_since_plan = 0
        self._warned = False
        self.out_until_plan = False
        self.cache_policy.arm()

    # ------------------------------------------------------------------ the ops

    def run_op(self, entry: ops.OpEntry) -> None:
        if self.is_profiling() or not self._acts_in_this_micro_batch(entry.kind):
            return
        if entry.kind == ops.LAUNCH:
            self.forward_start_bytes = self.mover.device.allocated_bytes()
            self.readings = {"fwd_start_allocated_bytes": self.forward_start_bytes}
            self._launch(entry.task_ids)
        elif entry.kind == ops.RELOAD:
            if not self.blocking:
                self._reload(entry.task_ids)
        elif entry.kind == ops.EMPTY_CACHE:
            self.cache_policy.at_step_start()
        elif entry.kind == ops.END_BACKWARD:
            self._end_backward()
        elif entry.kind == ops.RELEASE:
            release = self.mover.reclaim if self.reclaim_at_sites else self.mover.release
            for task_id in self.release_sites.get(entry.site, ()):
                release(self.slots[task_id])

    def _acts_in_this_micro_batch(self, kind: str) -> bool:
        """With gradient accumulation: the states go out in the first micro-batch after an optimizer step and come
        back in the last one (see the module docstring)."""
        if kind in (ops.LAUNCH, ops.EMPTY_CACHE):
            return self.micro_batches.first()
        if kind in (ops.RELOAD, ops.END_BACKWARD):
            return self.micro_batches.last()
        return True

    def _launch(self, task_ids: tuple[str, ...]) -> None:
        wanted = task_ids if self.blocking else [task_id for task_id in task_ids if task_id in self.planned]
        self._count_offloads(self.mover.offload(self.slots[task_id] for task_id in wanted if task_id in self.slots))
        if self.blocking:
            self.mover.synchronize()

    def _count_offloads(self, started: list[TaskSlot]) -> None:
        """Count copies out; one cycle per optimizer step, whether they start at the launch op or after updates."""
        if started and not self._cycle_counted:
            ops.COUNTERS.offload_cycles += 1
            self._cycle_counted = True
        ops.COUNTERS.offload_launches += len(started)
        ops.COUNTERS.offload_bytes += sum(slot.task.nbytes for slot in started)

    def _reload(self, task_ids: tuple[str, ...]) -> None:
        for task_id in task_ids:
            slot = self.slots.get(task_id)
            if slot is not None and self.mover.reload(slot):
                ops.COUNTERS.reloads += 1
                ops.COUNTERS.reload_bytes += slot.task.nbytes

    def _end_backward(self) -> None:
        self._cycle_counted = False  # the states' next trip out is the next optimizer step's
        if self.blocking:
            self._reload(tuple(self.slots))
            self.mover.synchronize()
        else:
            self._bring_back(self.slots.values(), where="end of backward")
            if not self.gated:
                self.mover.wait_reloaded(self.slots.values())
        if self._ends_since_plan is not None:
            self._ends_since_plan += 1

    def take_readings(self) -> dict[str, int]:
        """The last step's allocator readings, cleared: a step whose ops did not run reports none."""
        readings, self.readings = self.readings, {}
        return readings

    # ------------------------------------------------------------------ the optimizer step

    def before_sub_group_step(self, sub_group: int) -> None:
        """ZeRO-3 is about to update this sub-group: its states must be (on their way) on the device, and the
        compute stream must wait for their copies."""
        slots = self._sub_group_slots(sub_group)
        self._bring_back(slots, where=f"optimizer step of sub-group {sub_group}")
        self.mover.wait_reloaded(slots)

    def after_sub_group_step(self, sub_group: int) -> None:
        """ZeRO-3 has queued this sub-group's update: before the first plan, its states go back out; with
        launch=after_update, its planned states do once a plan is armed (their copies wait for the update on the
        compute stream; the blocks are reusable once the copies are done, or, held, at their release sites)."""
        if self.out_until_plan:
            self.adopt(self._discover())  # the first update creates the moments
            self.mover.offload(self._sub_group_slots(sub_group), hold=False)
        elif self.launch_after_update:
            planned = [slot for slot in self._sub_group_slots(sub_group) if slot.task.id in self.planned]
            self._count_offloads(self.mover.offload(planned))

    def _sub_group_slots(self, sub_group: int) -> list[TaskSlot]:
        return [slot for slot in self.slots.values() if slot.task.sub_group == sub_group]

    def _bring_back(self, slots: Iterable[TaskSlot], where: str) -> None:
        restored = [slot for slot in slots if self.mover.reload(slot)]
        if not restored:
            return
        self.fallback_reloads += len(restored)
        # The compile step restores the states the plan keeps resident; later, a state found out here means
        # its reload op did not run (dropped by a compiler, or a graph without our ops).
        if self._ends_since_plan and not self._warned:
            self._warned = True
            logger.warning("offload: %d optimizer state(s) were still on the host at the %s and were reloaded "
                           "outside the graph (warned once per plan): %s", len(restored), where,
                           [slot.task.id for slot in restored])
