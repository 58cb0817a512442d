"""Figures that fit a paper: on the committed fixture, the committed capacity results and a sweep that mixes
knobs, every legend and title lies inside the figure, panel titles keep apart, and labels name only the keys
that vary between the points shown, in a fixed order."""
import itertools
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
from analysis import budget_figures, capacity, step_figures, throughput_figures  # noqa: E402
from analysis.design import design, format_value  # noqa: E402
from analysis.fixtures.synthetic import write_point  # noqa: E402
from analysis.layout import unwrap  # noqa: E402
from analysis.load import load_sweep  # noqa: E402
from conftest import REPO_ROOT, lies_inside  # noqa: E402

FIXTURE = REPO_ROOT / "analysis" / "fixtures" / "sweep"
CAPACITY_RESULTS = REPO_ROOT / "results" / "capacity" / "sweep"
COMPILE = 5.0
DEVICE_GB = 16.0
# The order keys take in a label: workload, offload knobs, then other keys, the sweep's name last.
KEY_ORDER = ["micro_batch", "seq_len", "budget_gb", "reload", "release", "peak_cap_gb", "env.reserved_cap_gb",
             "sweep_name"]
DEFAULT_KNOBS = {"offload.reload": "asap", "offload.release": "recorded", "offload.peak_cap_gb": None,
                 "env.reserved_cap_gb": None}
pytestmark = pytest.mark.usefixtures("close_figures")


def write_mixed_sweep(sweep_dir: Path) -> None:
    """What a new user gets by pointing the report at several campaigns' points at once: a budget sweep, a
    reserved-cap run and an ordered-release run (each its own sweep.name, every knob written in another
    order), one point run out of memory, and a design point run again in a second sweep."""
    points = [("zero3", "budget_sweep", None, 1, {}), ("zero3", "budget_sweep", None, 2, {}),
              ("deepcompile", "budget_sweep", None, 1, {}), ("deepcompile", "budget_sweep", None, 2, {}),
              ("deepcompile", "rerun", None, 2, {})]
    points += [(arm, "budget_sweep", budget, 2, {}) for arm in ("ds_offload", "offload") for budget in (4.0, 8.0, 12.0)]
    points += [("ds_offload", "reserved_cap", 4.0, 2, {"env.reserved_cap_gb": 12}),
               ("offload", "reserved_cap", 4.0, 2, {"env.reserved_cap_gb": 12, "offload.peak_cap_gb": 12,
                                                    "offload.release": "ordered", "offload.reload": "at_end"}),
               *(("offload", "ordered", budget, 2, {"offload.peak_cap_gb": 12, "offload.release": "ordered"})
                 for budget in (4.0, 8.0))]
    for job, (arm, sweep, budget, micro_batch, knobs) in enumerate(points):
        knobs = {**DEFAULT_KNOBS, **knobs, "sweep.name": sweep}
        extra = dict(reversed(knobs.items())) if job % 2 else knobs  # overrides written in either order
        write_point(sweep_dir, job, arm=arm, micro_batch=micro_batch, budget_gb=budget, device_memory_gb=DEVICE_GB,
                    phase_times=[(COMPILE, 0.3, 0.4), (COMPILE, 0.5 + 0.01 * job, 0.6, 0.55)],
                    offload_bytes=None if budget is None else int((12 - budget) * 1e9), extra=extra)
    write_point(sweep_dir, len(points), arm="offload", budget_gb=2.0, status="oom", phase_times=[],
                device_memory_gb=DEVICE_GB, extra={**DEFAULT_KNOBS, "sweep.name": "budget_sweep"})


@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("mixed")
    write_mixed_sweep(sweep_dir)
    return load_sweep(sweep_dir)


SWEEPS = {"fixture": FIXTURE, "capacity results": CAPACITY_RESULTS, "mixed knobs": None}
BUILDERS = {
    "step_time_vs_budget": lambda sweep: budget_figures.step_time_vs_budget(sweep.points),
    "peak_reserved_vs_budget": lambda sweep: budget_figures.peak_reserved_vs_budget(sweep.points),
    "throughput_vs_micro_batch": lambda sweep: throughput_figures.throughput_vs_micro_batch(sweep.points),
    "step_time_per_step": lambda sweep: step_figures.step_series(sweep.points, sweep.steps, "step_time_s"),
    "peak_reserved_per_step": lambda sweep: step_figures.step_series(sweep.points, sweep.steps, "peak_reserved_bytes"),
    "capacity_frontier": lambda sweep: [capacity.frontier_plot(sweep.points, size)
                                        for size in capacity.emulated_sizes(sweep.points)],
    "capacity_peak_reserved": lambda sweep: [capacity.peak_reserved_plot(sweep.points, size)
                                             for size in capacity.emulated_sizes(sweep.points)],
}


def built(sweep, builder: str) -> list:
    made = BUILDERS[builder](sweep)
    return made if isinstance(made, list) else [made]


@pytest.fixture(params=SWEEPS, scope="module")
def sweep(request, mixed_sweep):
    return mixed_sweep if SWEEPS[request.param] is None else load_sweep(SWEEPS[request.param])


def titles(figure):
    return [ax.title for ax in figure.axes if ax.get_visible() and ax.title.get_text()]


def apart(first, second) -> bool:
    return first.x1 <= second.x0 or second.x1 <= first.x0 or first.y1 <= second.y0 or second.y1 <= first.y0


@pytest.mark.parametrize("builder", BUILDERS)
def test_every_legend_and_title_lies_inside_the_figure_and_titles_keep_apart(sweep, builder):
    for plot in built(sweep, builder):
        figure = plot.figure
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        assert figure.legends, plot.name
        for artist in [*figure.legends, *titles(figure)]:
            assert lies_inside(artist.get_window_extent(renderer), figure.bbox), (plot.name, artist)
        assert lies_inside(figure.get_tightbbox(renderer), figure.bbox_inches), plot.name  # nothing off the page
        extents = [title.get_window_extent(renderer) for title in titles(figure)]
        for first, second in itertools.combinations(extents, 2):
            assert apart(first, second), plot.name


def point_labels(figure, arms) -> list[str]:
    """Every legend entry, panel title and failure note that names a point (it starts with its arm), with
    what the figure adds to a label ('(no offload)', ': offloaded', ' #1', ' [OOM]', ': OOM') cut off."""
    texts = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    texts += [title.get_text() for title in titles(figure)]
    texts += [text.get_text() for ax in figure.axes for text in ax.texts]
    labels = []
    for text in map(unwrap, texts):
        label = text.split(" (no offload)")[0].split(": ")[0].split(" #")[0].split(" [")[0]
        if label.split(", ")[0] in arms:
            labels.append(label)
    return labels


@pytest.mark.parametrize("builder", BUILDERS)
def test_labels_name_only_keys_that_vary_between_an_arms_points_in_a_fixed_order(sweep, builder):
    points = sweep.points
    for plot in built(sweep, builder):
        labels = point_labels(plot.figure, set(points["arm"]))
        assert labels or points.empty, plot.name
        for label in labels:
            arm, *pairs = label.split(", ")
            own = points[points["arm"] == arm]
            if pairs and pairs[-1].startswith("auto"):  # where budgets are the axis: how an auto plan got its budget
                assert pairs.pop() in ("auto (device rule)", "auto (margin rule)", "auto"), label
                assert "budget" in builder and own["budget_gb"].map(format_value).eq("null").any(), label
            keys = [pair.split("=")[0] for pair in pairs]
            assert keys == sorted(keys, key=KEY_ORDER.index), label
            for key in keys:
                assert own[key].map(format_value).nunique() > 1, (label, key)
            assert any(all(format_value(row[key]) == value for key, value in (pair.split("=", 1) for pair in pairs))
                       for row in own.to_dict("records")), label  # the label is some point's own


def test_the_mixed_sweep_labels_its_series_by_every_knob_that_varies_and_its_sweep_only_where_needed(mixed_sweep):
    plot = budget_figures.step_time_vs_budget(mixed_sweep.points)
    labels = set(point_labels(plot.figure, {"ds_offload", "offload", "zero3", "deepcompile"}))
    assert {"ds_offload, env.reserved_cap_gb=12", "ds_offload, env.reserved_cap_gb=null",
            "offload, reload=at_end, release=ordered, peak_cap_gb=12, env.reserved_cap_gb=12",
            "offload, reload=asap, release=ordered, peak_cap_gb=12, env.reserved_cap_gb=null",
            "offload, reload=asap, release=recorded, peak_cap_gb=null, env.reserved_cap_gb=null",
            "zero3, micro_batch=1", "deepcompile, micro_batch=2, sweep_name=rerun"} <= labels
    # the sweep's name says nothing that the knobs do not already say, except for the re-run design point
    assert not any("sweep_name" in label for label in labels if not label.startswith("deepcompile"))


def test_a_key_that_varies_only_where_a_figure_shows_no_point_stays_out_of_its_labels(tmp_path):
    write_point(tmp_path, 0, arm="offload", budget_gb=4.0, phase_times=[(COMPILE, 0.3, 0.3)])
    write_point(tmp_path, 1, arm="offload", budget_gb=8.0, phase_times=[(COMPILE, 0.2, 0.2)])
    # a failed point of another micro-batch: no per-step panel of its own
    write_point(tmp_path, 2, arm="offload", budget_gb=8.0, micro_batch=4, status="oom", phase_times=[])
    sweep = load_sweep(tmp_path)
    assert "micro_batch" in design(sweep.points).shown["offload"]
    plot = step_figures.step_series(sweep.points, sweep.steps)
    assert [unwrap(title.get_text()) for title in titles(plot.figure)] == \
        ["offload, budget_gb=4", "offload, budget_gb=8"]


def test_label_order_does_not_follow_the_order_overrides_were_written(tmp_path):
    settings = [{"train.reduce_bucket_size": 5e7, "env.reserved_cap_gb": None, "sweep.name": "first"},
                {"sweep.name": "first", "env.reserved_cap_gb": 12, "train.reduce_bucket_size": None},
                {"env.reserved_cap_gb": None, "train.reduce_bucket_size": 5e7, "sweep.name": "again"}]
    for job, extra in enumerate(settings):
        write_point(tmp_path, job, arm="offload", extra=extra)
    points = load_sweep(tmp_path).points
    points_design = design(points)
    # other keys alphabetically, the sweep's name last (needed here: the first and last points differ in no other)
    assert [points_design.label(row) for row in points.to_dict("records")] == [
        "offload, env.reserved_cap_gb=null, train.reduce_bucket_size=50000000, sweep_name=first",
        "offload, env.reserved_cap_gb=12, train.reduce_bucket_size=null, sweep_name=first",
        "offload, env.reserved_cap_gb=null, train.reduce_bucket_size=50000000, sweep_name=again"]
