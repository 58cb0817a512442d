"""Where a micro-batch sits in gradient accumulation, asked by our ops each time they run.

With `gradient_accumulation_steps` = G the compiled graphs run G times per optimizer step, and only the last
micro-batch's optimizer step reads the states. So the states go out at the first micro-batch's forward after an
optimizer step and come back during the last one's backward; the ops of the micro-batches between them do nothing.
The ops read the position when they run, never at compile time: one compiled graph serves every micro-batch.
"""
from __future__ import annotations

from typing import Protocol


class MicroBatches(Protocol):
    def first(self) -> bool:
        """This micro-batch is the first since the last optimizer step: the states go out in its forward."""

    def last(self) -> bool:
        """The optimizer step follows this micro-batch: the states come back in its backward."""


class WholeSteps:
    """No accumulation: every micro-batch is a whole optimizer step."""

    def first(self) -> bool:
        return True

    def last(self) -> bool:
        return True


class EngineMicroBatches:
    """A DeepSpeed engine's own account: its micro-step counter (advanced by every `engine.step()`, the optimizer
    stepping only on the last of G) and `is_gradient_accumulation_boundary()`, which DeepCompile also passes to
    its backward to decide whether this backward's gradients are final."""

    def __init__(self, engine):
        self.engine = engine

    def first(self) -> bool:
        return self.engine.micro_steps % self.engine.gradient_accumulation_steps() == 0

    def last(self) -> bool:
        return bool(self.engine.is_gradient_accumulation_boundary())
