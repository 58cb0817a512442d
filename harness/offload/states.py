"""The optimizer states of a ZeRO-3 optimizer (DeepSpeedZeroOptimizer_Stage3) as offload tasks, and the hook that
lets each sub-group's update wait only for its own states.

A task is one tensor of one ZeRO sub-group: the fp32 master partition or one optimizer state (Adam's exp_avg,
exp_avg_sq, ...). Moving a task rebinds the tensor object's `.data` between a device buffer and a pinned host
buffer, so the object the optimizer keys its state by (and the dict that holds the states) never changes.
Tasks are listed in the order ZeRO-3's step() touches them: sub-group by sub-group, master partition first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

MASTER_KEY = "fp32"
_FIRST_STATE_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True, eq=False)
class Task:
    """One offload task on the device: the tensor that moves (the planner sees it as profile.Task, its id and bytes;
    the runtime keeps its host copy in a mover.TaskSlot)."""
    sub_group: int
    key: str                 # MASTER_KEY or the optimizer-state key
    tensor: torch.Tensor     # the object whose .data moves

    @property
    def id(self) -> str:
        return f"{self.sub_group}:{self.key}"

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def _owns_its_storage(tensor: torch.Tensor) -> bool:
    """Only a tensor that is its storage's sole view gives memory back when its .data moves. A view (e.g. the
    master partition aliasing the model's partition when weights train in fp32) must stay put."""
    return tensor._base is None and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def _state_keys(state: dict, numel: int) -> list[str]:
    """Per-element state tensors (same numel as the partition); scalars such as `step` stay where they are."""
    keys = [key for key, value in state.items() if torch.is_tensor(value) and value.numel() == numel]
    first = [key for key in _FIRST_STATE_KEYS if key in keys]
    return first + sorted(key for key in keys if key not in first)


def discover_tasks(zero_optimizer) -> list[Task]:
    """The movable states of every sub-group, in step order. Tensors already seen (aliases) are listed once."""
    tasks, seen = [], set()
    inner_state = zero_optimizer.optimizer.state
    for sub_group, master in enumerate(zero_optimizer.fp32_partitioned_groups_flat):
        state = inner_state.get(master, {})
        candidates = [(MASTER_KEY, master)] + [(key, state[key]) for key in _state_keys(state, master.numel())]
        for key, tensor in candidates:
            if id(tensor) in seen or tensor.numel() == 0 or not _owns_its_storage(tensor):
                continue
            seen.add(id(tensor))
            tasks.append(Task(sub_group, key, tensor))
    return tasks


class SubGroupGate:
    """Runs `before_update(sub_group_id)` at the start of each sub-group's turn in ZeRO-3's step(), and
    `after_update(sub_group_id)` (if given) at its end.

    `_prepare_sub_group` is the first thing step() does for a sub-group: it attaches the fp32 gradient to the
    master partition (which must already be a device tensor by then) and precedes every kernel that reads the
    sub-group's states. Waiting there, per sub-group, lets sub-group 0 update while later states still copy in.
    `_release_sub_group` is the last thing step() does for a sub-group, once its update has been queued.
    """

    _MARK = "_offload_harness_gate"

    def __init__(self, zero_optimizer, before_update: Callable[[int], None],
                 after_update: Callable[[int], None] | None = None):
        self.optimizer = zero_optimizer
        self.before_update = before_update
        self.after_update = after_update

    def install(self) -> None:
        self._wrap("_prepare_sub_group", before=self.before_update)
        if self.after_update is not None:
            self._wrap("_release_sub_group", after=self.after_update)

    def _wrap(self, method: str, before: Callable[[int], None] | None = None,
              after: Callable[[int], None] | None = None) -> None:
        original = getattr(self.optimizer, method)
        original = getattr(original, self._MARK, original)  # re-installing replaces, never stacks

        def gated(sub_group_id, *args, **kwargs):
            if before is not None:
                before(sub_group_id)
            result = original(sub_group_id, *args, **kwargs)
            if after is not None:
                after(sub_group_id)
            return result

        setattr(gated, self._MARK, original)
        setattr(self.optimizer, method, gated)
