"""zero_offload: ZeRO-Offload, eager ZeRO-3 with the optimizer and its states on the host (DeepSpeed's CPU Adam,
built at first use); conf/arm/zero_offload.yaml sets offload_optimizer=cpu."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from harness.arms.base import Display, EagerArm


@dataclass(frozen=True)
class ZeroOffload(EagerArm):
    keeps_optimizer_states_on_gpu: ClassVar[bool] = False
    display: ClassVar[Display] = Display("ZeRO-Offload", "#CC79A7", "v", table_order=4, capacity_order=1)
