"""Arms: the ways of training one model with ZeRO-3 that the harness compares, one class per arm.

`arm=NAME` picks conf/arm/NAME.yaml: its `_target_` names the class (one module per arm in this package), its
other keys are the arm's knobs (the class's fields). registry.py imports the classes the contract's registry
names (harness/contract/arm_targets.py); nothing imports a class because a run dir names it. An arm object owns its
DeepSpeed config, its compile schedule and phase starts, its checks, its counters and planned bytes; its class
attributes say what it needs and how analysis shows it. DeepSpeed and torch are imported only inside the methods
that run them, so the driver, `harness bench` and analysis import this package without them.
"""
from harness.arms.base import Arm, BenchRole, CompiledArm, Display, EagerArm, OffloadPassArm
from harness.arms.registry import (ADMITTED_ENV, TARGET, admit, admit_handed, arm_names, check_knobs, class_of,
                                   from_config, handed_to_ranks, known_class, registered)

__all__ = ["ADMITTED_ENV", "TARGET", "Arm", "BenchRole", "CompiledArm", "Display", "EagerArm", "OffloadPassArm",
           "admit", "admit_handed", "arm_names", "check_knobs", "class_of", "from_config", "handed_to_ranks",
           "known_class", "registered"]
