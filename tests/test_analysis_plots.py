"""Paper figures: fixed arm styles, labelled axes, IQR bars, failures by status, reproducible files."""
import statistics

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from matplotlib.colors import to_hex  # noqa: E402

from analysis import budget_figures, plots, step_figures, throughput_figures  # noqa: E402
from analysis.fixtures.synthetic import write_point  # noqa: E402
from analysis.layout import unwrap  # noqa: E402
from analysis.load import load_sweep  # noqa: E402
from harness.contract.steps import quartiles  # noqa: E402

COMPILE = 5.0
pytestmark = pytest.mark.usefixtures("close_figures")


@pytest.fixture
def budget_sweep(tmp_path):
    """Both offload arms at three budgets (one OOM), zero3 and deepcompile as references."""
    write_point(tmp_path, 0, arm="zero3", phase_times=[(COMPILE, 1.0, 1.2, 1.1)])
    write_point(tmp_path, 1, arm="deepcompile", phase_times=[(COMPILE, 0.6, 0.5), (COMPILE, 0.4, 0.45, 0.5)])
    job = 2
    for arm, slowdown in (("ds_offload", 1.5), ("offload", 1.0)):
        for budget in (2.0, 6.0, 10.0):
            times = (COMPILE, 0.3 * slowdown * 12 / budget, 0.32 * slowdown * 12 / budget, 0.4 * 12 / budget)
            write_point(tmp_path, job, arm=arm, budget_gb=budget, phase_times=[times],
                        offload_bytes=int((12 - budget) * 1e9), peak_reserved=int(budget * 0.9e9))
            job += 1
    write_point(tmp_path, job, arm="offload", budget_gb=1.0, status="oom", phase_times=[])
    return load_sweep(tmp_path)


def errorbar_line(ax, label):
    """The data line of the error-bar series called `label`."""
    [line] = [container.lines[0] for container in ax.containers if container.get_label() == label]
    return line


def line_colours(figure):
    return {to_hex(line.get_color()) for ax in figure.axes for line in ax.lines}


def test_each_arm_keeps_its_colour_in_every_figure(budget_sweep):
    allowed = {to_hex(colour) for colour, _ in plots.ARM_STYLES.values()} | {"#000000"}  # black: budget, boundaries
    built = [budget_figures.step_time_vs_budget(budget_sweep.points),
             budget_figures.peak_reserved_vs_budget(budget_sweep.points),
             throughput_figures.throughput_vs_micro_batch(budget_sweep.points),
             step_figures.step_series(budget_sweep.points, budget_sweep.steps)]
    for plot in built:
        assert line_colours(plot.figure) <= allowed
    offload_colour, offload_marker = plots.ARM_STYLES["offload"]
    step_time = built[0].figure.axes[0]
    offload = errorbar_line(step_time, "offload")
    assert (to_hex(offload.get_color()), offload.get_marker()) == (to_hex(offload_colour), offload_marker)
    assert len({style for style in plots.ARM_STYLES.values()}) == len(plots.ARM_STYLES)


def test_step_time_vs_budget_draws_medians_with_iqr_and_offloaded_gb(budget_sweep):
    plot = budget_figures.step_time_vs_budget(budget_sweep.points)
    step_time_ax, offloaded_ax = plot.figure.axes
    offload = errorbar_line(step_time_ax, "offload")
    measured = [[0.3 * 12 / b, 0.32 * 12 / b, 0.4 * 12 / b] for b in (2.0, 6.0, 10.0)]
    assert np.allclose(offload.get_xdata(), [2.0, 6.0, 10.0])
    assert np.allclose(offload.get_ydata(), [statistics.median(times) for times in measured])
    rows = plot.data[(plot.data["series"] == "offload") & (plot.data["kind"] == "step_time_s")]
    assert np.allclose(rows["y_low"], [quartiles(times)["p25"] for times in measured])
    assert np.allclose(rows["y_high"], [quartiles(times)["p75"] for times in measured])
    colour = plots.arm_style("offload")[0]  # each arm's dashed twin is in its colour; the key's own line is empty
    [offloaded] = [line for line in offloaded_ax.lines if len(line.get_xdata()) and line.get_color() == colour]
    assert np.allclose(offloaded.get_ydata(), [10.0, 6.0, 2.0])
    legend = [unwrap(text.get_text()) for text in plot.figure.legends[0].get_texts()]
    assert legend.count("offload") == 1 and "offloaded/step (right axis)" in legend  # one key for every dashed twin
    assert "(s)" in step_time_ax.get_ylabel() and "(GB)" in step_time_ax.get_xlabel()
    assert "(GB)" in offloaded_ax.get_ylabel()
    references = plot.data[plot.data["kind"] == "reference"]
    assert dict(zip(references["series"], references["y"])) == {"zero3": 1.1, "deepcompile": 0.45}
    assert [text.get_text() for text in step_time_ax.texts] == ["offload: OOM"]


def test_peak_reserved_vs_budget_draws_the_budget_line(budget_sweep):
    plot = budget_figures.peak_reserved_vs_budget(budget_sweep.points)
    ax = plot.figure.axes[0]
    [budget] = [line for line in ax.lines if line.get_label() == "budget"]
    assert np.allclose(budget.get_xdata(), budget.get_ydata())
    assert np.allclose(budget.get_xdata(), [1.0, 2.0, 6.0, 10.0])  # the OOM point's budget too
    offload = errorbar_line(ax, "offload")
    # the synthetic peak of step s is budget x 0.9 GB + s bytes; the last measured step is step 3
    assert np.allclose(offload.get_ydata(), [(b * 0.9e9 + 3) / 1e9 for b in (2.0, 6.0, 10.0)])
    assert "(GB)" in ax.get_ylabel()


def test_peak_reserved_bars_span_the_repeats_in_gb(tmp_path):
    for repeat, peak in enumerate((3e9, 5e9)):
        write_point(tmp_path, repeat, arm="offload", budget_gb=4.0, repeat=repeat, peak_reserved=int(peak))
    plot = budget_figures.peak_reserved_vs_budget(load_sweep(tmp_path).points)
    [row] = plot.data[plot.data["kind"] == "peak_reserved_gb"].to_dict("records")
    # the synthetic peak of step s is peak + s bytes; the last measured step is step 3
    assert np.allclose([row["y_low"], row["y"], row["y_high"]], [(p + 3) / 1e9 for p in (3e9, 4e9, 5e9)])


def test_throughput_vs_micro_batch_has_one_line_per_arm(tmp_path):
    for job, (arm, micro_batch, seconds) in enumerate([("zero3", 1, 0.1), ("zero3", 2, 0.15), ("zero3", 4, 0.25),
                                                        ("offload", 1, 0.2), ("offload", 2, 0.3)]):
        write_point(tmp_path, job, arm=arm, micro_batch=micro_batch, seq_len=100,
                    phase_times=[(COMPILE, seconds, seconds * 1.1, seconds * 0.9)])
    write_point(tmp_path, 9, arm="offload", micro_batch=4, seq_len=100, status="died", phase_times=[])
    plot = throughput_figures.throughput_vs_micro_batch(load_sweep(tmp_path).points)
    ax = plot.figure.axes[0]
    zero3 = errorbar_line(ax, "zero3")
    assert list(zero3.get_xdata()) == [1, 2, 4]
    assert np.allclose(zero3.get_ydata(), [100 * mb / s for mb, s in ((1, 0.1), (2, 0.15), (4, 0.25))])
    assert [text.get_text() for text in ax.texts] == ["offload: DIED"]
    assert "tokens/s" in ax.get_ylabel()


def test_step_series_marks_phase_boundaries(budget_sweep):
    plot = step_figures.step_series(budget_sweep.points, budget_sweep.steps)
    deepcompile_ax = next(ax for ax in plot.figure.axes if ax.get_title() == "deepcompile")
    boundaries = [line.get_xdata()[0] for line in deepcompile_ax.lines if line.get_linestyle() == "--"]
    assert boundaries == [2.5]  # phase 1 starts at step 3
    assert list(deepcompile_ax.lines[0].get_ydata()) == [COMPILE, 0.6, 0.5, COMPILE, 0.4, 0.45, 0.5]
    assert deepcompile_ax.get_yscale() == "log"  # compile steps 10x the others
    panels = [ax for ax in plot.figure.axes if ax.get_visible()]
    assert len(panels) == len(budget_sweep.points) - 1  # the OOM point has no steps


def test_same_inputs_give_identical_plot_data_and_files(budget_sweep, tmp_path):
    build = [budget_figures.step_time_vs_budget, budget_figures.peak_reserved_vs_budget,
             throughput_figures.throughput_vs_micro_batch]
    for builder in build:
        first, again = builder(budget_sweep.points), builder(load_sweep(budget_sweep.points["sweep"][0]).points)
        for line, twin in zip(first.figure.axes[0].lines, again.figure.axes[0].lines, strict=True):
            assert np.array_equal(line.get_xydata(), twin.get_xydata())
        written = plots.save_plot(first, tmp_path / "first")
        rewritten = plots.save_plot(again, tmp_path / "again")
        assert [path.suffix for path in written] == [".pdf", ".png", ".csv"]
        assert all(path.stat().st_size > 0 for path in written)
        assert [path.read_bytes() for path in written] == [path.read_bytes() for path in rewritten]


def test_budget_figures_of_a_sweep_without_offload_points_say_so(tmp_path):
    write_point(tmp_path, 0, arm="zero3", phase_times=[(COMPILE, 1.0, 1.2, 1.1)])
    write_point(tmp_path, 1, arm="zero_offload", phase_times=[(COMPILE, 2.0, 2.2, 2.1)])
    for builder in (budget_figures.step_time_vs_budget, budget_figures.peak_reserved_vs_budget):
        plot = builder(load_sweep(tmp_path).points)
        ax = plot.figure.axes[0]
        assert [text.get_text() for text in ax.texts] == ["no offload points in this sweep"]
        assert list(plot.data.loc[plot.data["kind"] == "reference", "series"]) == ["zero3"]
