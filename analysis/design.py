"""Design points and their labels: which config columns tell the points of a sweep apart, and a label that
names a point by its arm and only the keys that vary between the points shown beside it, in a fixed order."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.columns import CONFIG_COLUMNS, IDLE, OVER_BUDGET, is_design_column
from harness.arms import arm_names, registered
from harness.contract.units import GB

REPEAT_COLUMNS = ("repeat", "seed")
# Columns that name where a point was run rather than how: a label shows one only where the other keys
# leave two points of an arm looking the same (two sweeps of the same design).
NAMING_COLUMNS = ("sweep_name",)
_STANDARD_ORDER = [column for column in CONFIG_COLUMNS.values() if column not in NAMING_COLUMNS]
OFFLOAD_ARMS = arm_names(lambda arm: arm.offloads_opt_states)
GIVEN_BUDGET_COLUMNS = ("budget_gb", "budget_fraction")
AUTO_RULE_NAMES = {"device_limit": "device rule", "margin": "margin rule"}


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def is_idle(value: Any) -> bool:
    """A key the point's arm reads but its other values left without effect (analysis.columns.IDLE)."""
    return isinstance(value, str) and value == IDLE


def format_value(value: Any) -> str:
    """A config value in a label: integral floats (pandas' ints with gaps) without '.0', missing as null."""
    if is_missing(value):
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def varies(column: pd.Series) -> bool:
    """More than one value, a missing one (an auto budget, say) counting as a value of its own."""
    return column.map(format_value).nunique() > 1


def label_order(column: str) -> tuple[int, int, str]:
    """The fixed order of keys in a label, whatever the order of the overrides: the arm's own knobs
    (arm_<knob>) next to the arm, then the standard columns in their order (workload, offload knobs, device,
    ranks), then any other key alphabetically, naming columns last."""
    if column.startswith("arm_"):
        return (0, 0, column)
    if column in _STANDARD_ORDER:
        return (1, _STANDARD_ORDER.index(column), column)
    if column in NAMING_COLUMNS:
        return (3, NAMING_COLUMNS.index(column), column)
    return (2, 0, column)


@dataclass(frozen=True)
class Design:
    """What tells design points apart: `keys` = arm plus every config column that varies between the points
    of one arm (repeats aside, unless asked for); `shown` = per arm, the keys that vary between its points, in label
    order; `values` = per arm, the distinct values of those keys as labels write them."""

    keys: list[str]
    shown: dict[str, list[str]]
    values: dict[str, pd.DataFrame]
    # per design point over its budget: (its key values as labels write them, the most over, runs over, runs)
    over_budget: list[tuple[dict[str, str], float, int, int]] = field(default_factory=list)
    run_counts: list[tuple[dict[str, str], int]] = field(default_factory=list)  # runs per design point
    # per arm whose points mix a given budget and none: the rule that made the budget of those given none
    # ('device rule'); their labels name the budget beside the arm (budget_name)
    budget_named: dict[str, str | None] = field(default_factory=dict)

    def label(self, row: Mapping[str, Any], leave_out: Iterable[str] = (),
              note_leave_out: Iterable[str] | None = None) -> str:
        """'offload, budget_gb=12, empty_cache=phase': the arm and what else sets this point apart from the
        arm's other points; keys in `leave_out` are shown elsewhere (an axis, a column), keys the point left idle
        (IDLE: our pass's auto_rule beside a budget) are not shown. The over-budget note covers the points that
        agree on the keys but `note_leave_out` (default: `leave_out`, all points along a line)."""
        arm = row["arm"]
        note = self.over_budget_note(row, leave_out if note_leave_out is None else note_leave_out)
        leave_out = set(leave_out)
        settings = [key for key in self.shown.get(arm, []) if key not in NAMING_COLUMNS]
        named = arm in self.budget_named and leave_out.isdisjoint(GIVEN_BUDGET_COLUMNS)
        keys = [key for key in self.shown.get(arm, []) if key not in leave_out and not is_idle(row[key])
                and (key not in NAMING_COLUMNS or self._needed(arm, key, settings))
                and not (named and key in GIVEN_BUDGET_COLUMNS)]
        head = f"{arm} {budget_name(row, self.budget_named[arm])}" if named else str(arm)
        return ", ".join([head, *(f"{key}={format_value(row[key])}" for key in keys), *([note] if note else [])])

    def over_budget_note(self, row: Mapping[str, Any], leave_out: Iterable[str] = ()) -> str | None:
        """'over budget by 1.29 GB' ('... in 2 of 3 runs'; 'by up to' where the points it covers went over by
        different amounts): a design point whose plan was infeasible or whose measured peak passed its budget,
        matched on the design keys the row has but those left out (a line along an axis covers the points along it);
        None where every point it covers kept its budget."""
        leave_out = set(leave_out)
        matches = [(over, n_over, n_runs) for values, over, n_over, n_runs in self.over_budget
                   if all(format_value(row[key]) == value for key, value in values.items()
                          if key in row and key not in leave_out)]
        if not matches:
            return None
        amounts = {f"{over / GB:.2f}" for over, _, _ in matches}
        over, n_over = max(over for over, _, _ in matches), sum(n_over for _, n_over, _ in matches)
        n_runs = self._runs_covered(row, leave_out) or max(n_runs for _, _, n_runs in matches)
        return (f"over budget by {'up to ' if len(amounts) > 1 else ''}{over / GB:.2f} GB"
                + (f" in {n_over} of {n_runs} runs" if n_over < n_runs else ""))

    def _runs_covered(self, row: Mapping[str, Any], leave_out: set[str]) -> int:
        """How many runs the row's line covers (over budget or not)."""
        return sum(count for values, count in self.run_counts
                   if all(format_value(row[key]) == value for key, value in values.items()
                          if key in row and key not in leave_out))

    def _needed(self, arm: str, naming: str, settings: list[str]) -> bool:
        """Whether some points of the arm that agree on every setting differ in this naming key."""
        if not settings:
            return True
        return bool((self.values[arm].groupby(settings)[naming].nunique() > 1).any())


def design(points: pd.DataFrame, repeats: bool = False) -> Design:
    """Knobs that only one arm has (or that differ only between arms) are told apart by the arm already.
    Pass the points a table or figure shows: a key varies or not between those. With `repeats`, the repeat
    columns count as keys too, for a printer that lists every run rather than design points (harness bench)."""
    candidates = [column for column in points.columns if is_design_column(column) and column != "arm"
                  and (repeats or column not in REPEAT_COLUMNS)]
    shown, values = {}, {}
    for arm, rows in points.groupby("arm", sort=False):
        # Values a point left idle say nothing about it: a key varies by the values that acted (our pass's
        # budget_rule deepspeed on every budgeted point and idle on the device rule's does not vary).
        shown[arm] = sorted((column for column in candidates if varies(rows[column][~rows[column].map(is_idle)])),
                            key=label_order)
        values[arm] = pd.DataFrame({column: rows[column].map(format_value)
                                    for column in shown[arm]}).drop_duplicates()
    keys = ["arm", *[column for column in candidates if any(column in columns for columns in shown.values())]]
    over, counts = _over_budget(points, keys)
    return Design(keys=keys, shown=shown, values=values, over_budget=over, run_counts=counts,
                  budget_named=_budget_named(points, shown))


def given_budget(point: Mapping[str, Any]) -> bool:
    """Whether the point was given a budget (GB or a fraction of the device), not left to a rule to make one."""
    return any(not is_missing(point.get(column)) and not is_idle(point.get(column)) for column in GIVEN_BUDGET_COLUMNS)


def auto_rule_name(point: Mapping[str, Any]) -> str | None:
    """'device rule', 'margin rule': the rule that made the budget of an offload point given none (an arm without
    our pass's auto_rule has DeepSpeed's margin rule only); None where the point was given one, does not offload, or
    its rule is unknown."""
    if point["arm"] not in OFFLOAD_ARMS or given_budget(point):
        return None
    rule = point.get("auto_rule")
    if is_missing(rule) or is_idle(rule):
        arm = registered().get(point["arm"])
        rule = None if arm is None or "auto_rule" in arm.offload_keys else "margin"
    return None if rule is None else AUTO_RULE_NAMES.get(rule, rule)


def budget_source(point: Mapping[str, Any]) -> str | None:
    """'auto (device rule)', 'auto (margin rule)': how an offload point planned without a given budget got one
    ('auto' where the rule is unknown); None for a given budget or an arm that does not offload."""
    if point["arm"] not in OFFLOAD_ARMS or given_budget(point):
        return None
    rule = auto_rule_name(point)
    return "auto" if rule is None else f"auto ({rule})"


def budget_name(row: Mapping[str, Any], rule: str | None = None) -> str:
    """'@ 12.8 GB', '@ 0.8 of the device', '(device rule)': the budget of a point whose arm also ran at another, by
    the config (a point given none by the rule that made its budget; `rule` where the row does not say it)."""
    if not is_missing(row.get("budget_gb")) and not is_idle(row.get("budget_gb")):
        return f"@ {format_value(row['budget_gb'])} GB"
    if given_budget(row):
        return f"@ {format_value(row['budget_fraction'])} of the device"
    return f"({auto_rule_name(row) or rule or 'auto'})"


def _budget_named(points: pd.DataFrame, shown: Mapping[str, list[str]]) -> dict[str, str | None]:
    """Arm -> the rule of its points given no budget, for each arm whose points mix those with ones given a budget
    (a given-budget column varies, a missing value counting): only there does a label name the budget."""
    named = {}
    for arm, rows in points.groupby("arm", sort=False):
        if arm not in OFFLOAD_ARMS or not set(shown[arm]) & set(GIVEN_BUDGET_COLUMNS):
            continue
        given = [given_budget(point) for point in rows.to_dict("records")]
        if any(given) and not all(given):
            rules = {auto_rule_name(point) for point, has in zip(rows.to_dict("records"), given) if not has}
            named[arm] = rules.pop() if len(rules) == 1 else None
    return named


def _over_budget(points: pd.DataFrame, keys: list[str]) -> tuple[list, list]:
    """Design.over_budget and Design.run_counts of the points (none over where no point has the column)."""
    over_budget, counts = [], []
    for key, group in points.groupby(keys, dropna=False, sort=False):
        values = {name: format_value(value) for name, value in zip(keys, key)}
        counts.append((values, len(group)))
        over = group[OVER_BUDGET].astype(float).fillna(0) if OVER_BUDGET in group else pd.Series(dtype=float)
        if (over > 0).any():
            over_budget.append((values, float(over.max()), int((over > 0).sum()), len(group)))
    return over_budget, counts


def along_axis(points_design: Design, points: pd.DataFrame, axis: str) -> tuple[list[str], list[str]]:
    """The keys of a table or figure along a swept axis, and what its labels leave out. Keys: the design keys with
    the axis last (an arm's cells stay together), less the keys that follow the axis one to one, which say
    nothing the axis does not (the accumulation campaign's gradient accumulation, 16 at micro-batch 1 to 2 at 8,
    and the row that sets both). Labels leave out the axis and those keys."""
    following = [key for key in points_design.keys if key not in ("arm", axis) and _follows(points, key, axis)]
    keys = [key for key in points_design.keys if key != axis and key not in following] + [axis]
    return keys, [axis, *following]


def _follows(points: pd.DataFrame, key: str, axis: str) -> bool:
    """Whether, within each arm, `key` takes one value per value of `axis`, a different one for each (the
    accumulation cut's rows are named per arm, ours_mb1 and ds_mb1, and each follows the micro-batch)."""
    if axis not in points or key not in points:
        return False
    along = False
    for _, rows in points.groupby("arm", sort=False):
        pairs = set(zip(rows[axis].map(format_value), rows[key].map(format_value)))
        if not len(pairs) == len({value for value, _ in pairs}) == len({value for _, value in pairs}):
            return False
        along = along or len(pairs) > 1
    return along
