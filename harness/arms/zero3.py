"""zero3: eager ZeRO-3, the baseline every speed-up is measured against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from harness.arms.base import Display, EagerArm


@dataclass(frozen=True)
class Zero3(EagerArm):
    baseline: ClassVar[bool] = True
    display: ClassVar[Display] = Display("ZeRO-3", "#0072B2", "o", table_order=0, capacity_order=0)
