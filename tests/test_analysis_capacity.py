"""Capacity under an emulated device: the PR #8186-shaped table, the frontier and peak-reserved figures and
the report's text files, from a synthetic ladder whose points run out of memory in phase 0, in phase 1 and
before step 0."""
import shutil
import statistics
from pathlib import Path

import matplotlib
import nbformat
import numpy as np
import pytest

matplotlib.use("Agg")
from matplotlib.colors import to_hex  # noqa: E402

from analysis import capacity  # noqa: E402
from analysis.fixtures.synthetic import write_point  # noqa: E402
from analysis.load import load_sweep  # noqa: E402
from analysis.plots import arm_style  # noqa: E402
from analysis.render import write_table  # noqa: E402
from analysis.report import run_notebook  # noqa: E402
from conftest import lies_inside  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"  # no emulated size
SIZE = 24.0
COMPILE = 5.0  # every synthetic phase starts with a compile step this long; the medians must leave it out
WARM_UP = (COMPILE, 0.3, 0.3)  # phase 0 of a compiled arm, before the final phase
COMPILED = ("deepcompile", "ds_offload", "offload")
pytestmark = pytest.mark.usefixtures("close_figures")


def oom(stage, phase):
    return {"stage": stage, "phase": phase, "step": None if stage == "build" else 3 * (phase or 0) + 1,
            "requested_bytes": 2 * 10**9, "free_bytes": 5 * 10**8, "limit_bytes": int(SIZE * 1e9),
            "reserved_bytes": 23 * 10**9, "allocated_bytes": 22 * 10**9, "message": "CUDA out of memory"}


OOM_P0, OOM_P1, OOM_BUILD, DIED = oom("step", 0), oom("step", 1), oom("build", None), "died"
# (arm, budget_gb) -> seq_len -> the runs of that point (repeats): the final phase's measured step times,
# or how it failed.
LADDER = {
    ("zero3", None): {512: [(0.10, 0.12, 0.11)], 1024: [(0.21, 0.20, 0.22)], 2048: [OOM_P0], 4096: [OOM_BUILD]},
    ("zero_offload", None): {512: [(0.5, 0.5, 0.5)], 1024: [(0.6, 0.62, 0.61)],
                             2048: [(0.7, 0.7, 0.7), OOM_P0], 4096: [DIED]},  # one repeat ran out: it still fits
    ("deepcompile", None): {512: [(0.05, 0.05, 0.06)], 1024: [OOM_P1], 2048: [OOM_P0], 4096: [OOM_BUILD]},
    ("ds_offload", 8.0): {512: [(0.15, 0.15, 0.15)], 1024: [(0.25, 0.26, 0.24)], 2048: [(0.45, 0.45, 0.46)],
                          4096: [OOM_P1]},
    ("offload", 8.0): {512: [(0.12, 0.12, 0.12)], 1024: [(0.2, 0.2, 0.2)], 2048: [(0.4, 0.41, 0.4)],
                       4096: [(0.8, 0.8, 0.8), (1.0, 1.0, 1.0)]},  # the one point of 4096 that fits
    ("offload", 16.0): {512: [(0.11, 0.11, 0.11)], 1024: [(0.19, 0.19, 0.19)], 2048: [OOM_P1], 4096: [OOM_P1]},
}


def peak_bytes(seq_len):
    return int(seq_len / 512 * 2.5e9)


def write_ladder(sweep_dir, ladder=LADDER, size=SIZE):
    job = 0
    for (arm, budget_gb), points in ladder.items():
        for seq_len, runs in points.items():
            for repeat, run in enumerate(runs):
                # the offload arms' points allocate within their budget (the fixture's peaks are reserved bytes)
                within = {} if budget_gb is None else {"step_values": {
                    "peak_allocated_bytes": min(peak_bytes(seq_len) // 2, int(budget_gb * 1e9))}}
                write_point(sweep_dir, job, arm=arm, budget_gb=budget_gb, seq_len=seq_len, micro_batch=1,
                            repeat=repeat, device_memory_gb=size, peak_reserved=peak_bytes(seq_len),
                            **run_files(arm, run), **within)
                job += 1


def run_files(arm, run):
    """write_point's arguments for one run: its step times, or the steps it did before it failed."""
    warm_up = [WARM_UP] if arm in COMPILED else []
    if isinstance(run, tuple):
        return {"phase_times": [*warm_up, (COMPILE, *run)]}
    if run == DIED:
        return {"status": "died", "phase_times": []}
    before = {"build": [], 0: [], 1: [WARM_UP]}[run["phase"] if run["stage"] == "step" else "build"]
    return {"status": "oom", "oom": run, "phase_times": before}


@pytest.fixture(scope="module")
def ladder_dir(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("capacity")
    write_ladder(sweep_dir)
    return sweep_dir


@pytest.fixture(scope="module")
def points(ladder_dir):
    return load_sweep(ladder_dir).points


def test_cells_are_final_phase_medians_or_where_the_point_ran_out(points):
    table = capacity.capacity_table(points, SIZE)
    header = [name for _, name in table.display.columns]
    assert header == ["arm", "seq 512", "seq 1024", "seq 2048", "seq 4096", "largest that fits"]
    assert table.display.values.tolist() == [
        ["zero3", "0.11", "0.21", "OOM (p0)", "OOM (build)", "1024"],
        ["zero_offload", "0.5", "0.61", "0.7 (+OOM (p0))", "DIED", "2048"],
        ["deepcompile", "0.05", "OOM (p1)", "OOM (p0)", "OOM (build)", "512"],
        ["ds_offload", "0.15", "0.25", "0.45", "OOM (p1)", "2048"],
        ["offload, budget_gb=8", "0.12", "0.2", "0.4", "0.9 [0.8, 1]", "4096"],
        ["offload, budget_gb=16", "0.11", "0.19", "OOM (p1)", "OOM (p1)", "1024"],
    ]


def test_values_hold_the_medians_of_the_chosen_step_times(points):
    values = capacity.capacity_table(points, SIZE).values
    assert set(values["device_memory_gb"]) == {SIZE}
    for (arm, budget_gb), ladder in LADDER.items():
        for seq_len, runs in ladder.items():
            row = values[(values["arm"] == arm) & (values["seq_len"] == seq_len)
                         & ((values["budget_gb"] == budget_gb) if budget_gb else values["budget_gb"].isna())]
            ran = [statistics.median(times) for times in runs if isinstance(times, tuple)]
            assert row["n_runs"].item() == len(runs) and row["n_ok"].item() == len(ran)
            if ran:
                assert row["final_step_time_s_median"].item() == statistics.median(ran)
            else:
                assert np.isnan(row["final_step_time_s_median"].item())


def test_an_oom_without_an_oom_block_shows_plain_oom(tmp_path):
    write_point(tmp_path, 0, arm="zero3", seq_len=512, device_memory_gb=SIZE)
    write_point(tmp_path, 1, arm="zero3", seq_len=1024, device_memory_gb=SIZE, status="oom", phase_times=[])
    table = capacity.capacity_table(load_sweep(tmp_path).points, SIZE)
    assert table.display.values.tolist() == [["zero3", "0.5", "OOM", "512"]]


def test_the_caption_names_the_emulated_size_and_heads_the_markdown(points, tmp_path):
    table = capacity.capacity_table(points, SIZE)
    assert table.name == "capacity_24gb"
    assert "emulated 24 GB device (env.device_memory_gb)" in table.caption
    assert "OOM (pN): ran out of memory in phase N" in table.caption
    md, tex, csv, _ = write_table(table, tmp_path)
    lines = md.read_text().splitlines()
    assert lines[:3] == [f"*{table.caption}*", "",
                         "| arm | seq 512 | seq 1024 | seq 2048 | seq 4096 | largest that fits |"]
    assert tex.read_text().startswith("\\begin{tabular}{lrrrrr}")  # the paper's float carries the caption
    assert csv.read_text().startswith("arm,seq 512,")


def drawn(plot, kind):
    """series -> (x, y) of the plot's data rows of one kind."""
    rows = plot.data[plot.data["kind"] == kind]
    return {row["series"]: (row["x"], row["y"]) for row in rows.to_dict("records")}


def tokens_per_s(seq_len, arm, budget_gb=None):
    return seq_len / statistics.median(LADDER[(arm, budget_gb)][seq_len][0])


def test_frontier_draws_tokens_per_s_and_an_x_where_each_arm_first_ran_out(points):
    plot = capacity.frontier_plot(points, SIZE)
    zero3 = plot.data[(plot.data["series"] == "zero3") & (plot.data["kind"] == "tokens_per_s")]
    assert zero3["x"].tolist() == [512, 1024]
    assert np.allclose(zero3["y"], [tokens_per_s(512, "zero3"), tokens_per_s(1024, "zero3")])
    # level with the last point that ran; zero_offload never ran out in every repeat; offload at 8 GB fits
    assert drawn(plot, "first_oom") == {
        "zero3": (2048, tokens_per_s(1024, "zero3")),
        "deepcompile": (1024, tokens_per_s(512, "deepcompile")),
        "ds_offload": (4096, tokens_per_s(2048, "ds_offload", 8.0)),
        "offload, budget_gb=16": (2048, tokens_per_s(1024, "offload", 16.0)),
    }
    ax = plot.figure.axes[0]
    markers = {(line.get_xdata()[0], to_hex(line.get_color())) for line in ax.lines
               if line.get_marker() == "x" and len(line.get_xdata())}
    assert markers == {(2048, to_hex(arm_style("zero3")[0])), (1024, to_hex(arm_style("deepcompile")[0])),
                       (4096, to_hex(arm_style("ds_offload")[0])), (2048, to_hex(arm_style("offload")[0]))}
    assert drawn(plot, "failed") == {"zero_offload": (4096, pytest.approx(np.nan, nan_ok=True))}
    assert [text.get_text() for text in ax.texts] == ["zero_offload: DIED"]


def test_an_arm_that_never_fits_gets_its_x_at_the_bottom(tmp_path):
    write_point(tmp_path, 0, arm="zero3", seq_len=512, device_memory_gb=SIZE)
    write_point(tmp_path, 1, arm="deepcompile", seq_len=512, device_memory_gb=SIZE, status="oom",
                oom=OOM_BUILD, phase_times=[])
    plot = capacity.frontier_plot(load_sweep(tmp_path).points, SIZE)
    [(x, y)] = [xy for series, xy in drawn(plot, "first_oom").items() if series == "deepcompile"]
    assert x == 512 and np.isnan(y)
    [marker] = [line for line in plot.figure.axes[0].lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert marker.get_ydata()[0] == pytest.approx(0.04)  # in axes units: at the bottom


def test_peak_reserved_draws_the_emulated_device_line_and_the_first_ooms_on_it(points):
    plot = capacity.peak_reserved_plot(points, SIZE)
    ax = plot.figure.axes[0]
    [device] = [line for line in ax.lines if line.get_label() == "emulated device (24 GB)"]
    assert list(device.get_ydata()) == [SIZE, SIZE]
    assert drawn(plot, "device")["emulated device"][1] == SIZE
    assert {series: y for series, (_, y) in drawn(plot, "first_oom").items()} == {
        "zero3": SIZE, "deepcompile": SIZE, "ds_offload": SIZE, "offload, budget_gb=16": SIZE}
    offload = plot.data[(plot.data["series"] == "offload, budget_gb=8") & (plot.data["kind"] == "peak_reserved_gb")]
    assert offload["x"].tolist() == [512, 1024, 2048, 4096]
    # the synthetic peak of step s is the point's peak + s bytes
    assert np.allclose(offload["y"], [peak_bytes(seq_len) / 1e9 for seq_len in (512, 1024, 2048, 4096)])
    assert "(GB)" in ax.get_ylabel()


@pytest.mark.parametrize("builder", [capacity.frontier_plot, capacity.peak_reserved_plot])
def test_legend_and_title_lie_inside_the_figure_and_name_the_size(points, builder):
    plot = builder(points, SIZE)
    figure = plot.figure
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    [legend] = figure.legends
    [ax] = figure.axes
    assert "emulated 24 GB device" in ax.get_title()
    labels = [text.get_text() for text in legend.get_texts()]
    assert {"zero3", "offload, budget_gb=8", "first OOM (ran out of memory)"} <= set(labels)
    for artist in (legend, ax.title, ax.xaxis.label):
        assert lies_inside(artist.get_window_extent(renderer), figure.bbox), artist
    assert lies_inside(figure.get_tightbbox(renderer), figure.bbox_inches)  # nothing sticks out of the page


def text_files(paths):
    return sorted(path for path in paths if path.suffix in (".md", ".tex", ".csv"))


def test_the_report_writes_byte_identical_text_files_for_the_same_run_files(ladder_dir, tmp_path):
    copied = tmp_path / "elsewhere" / "sweep"
    shutil.copytree(ladder_dir, copied)  # run files at another path: nothing of the path may leak in
    first = capacity.write_capacity_report(ladder_dir, tmp_path / "first")
    again = capacity.write_capacity_report(copied, tmp_path / "again")
    assert [path.relative_to(tmp_path / "first") for path in first] == \
        [path.relative_to(tmp_path / "again") for path in again]
    assert [str(path.relative_to(tmp_path / "first")) for path in text_files(first)] == [
        "figures/capacity_frontier_24gb_data.csv", "figures/capacity_peak_reserved_24gb_data.csv",
        "tables/capacity_24gb.csv", "tables/capacity_24gb.md", "tables/capacity_24gb.tex",
        "tables/capacity_24gb_values.csv"]
    assert [path.read_bytes() for path in text_files(first)] == [path.read_bytes() for path in text_files(again)]
    assert all(path.stat().st_size > 0 for path in first)


def test_each_emulated_size_gets_its_own_files_and_real_device_points_are_left_out(tmp_path):
    write_ladder(tmp_path / "sweep", {("zero3", None): {512: [(0.1, 0.1, 0.1)], 1024: [OOM_P0]}}, size=24.0)
    write_point(tmp_path / "sweep", 10, arm="zero3", seq_len=1024, device_memory_gb=40.0)
    write_point(tmp_path / "sweep", 11, arm="zero3", seq_len=1024)  # the real device
    points = load_sweep(tmp_path / "sweep").points
    assert capacity.emulated_sizes(points) == [24.0, 40.0]
    written = capacity.write_capacity_files(points, tmp_path / "out")
    assert sorted(path.name for path in written if path.parent.name == "tables" and path.suffix == ".md") == \
        ["capacity_24gb.md", "capacity_40gb.md"]
    assert "| zero3 | 0.1 | OOM (p0) | 512 |" in (tmp_path / "out" / "tables" / "capacity_24gb.md").read_text()
    assert "| zero3 | 0.5 | 1024 |" in (tmp_path / "out" / "tables" / "capacity_40gb.md").read_text()
    # 40 GB ran one length: its table holds it, a figure would stack it at one x
    assert sorted(path.name for path in written if path.suffix == ".png") == \
        ["capacity_frontier_24gb.png", "capacity_peak_reserved_24gb.png"]
    assert capacity.capacity_lines(points) == [
        "capacity at an emulated 24 GB: 2 point(s)",
        "capacity at an emulated 40 GB: 1 point(s), at one ladder value: the table, no figures",
        "left out 1 point(s) on the real device (no env.device_memory_gb)"]


def notebook_text(out_dir):
    notebook = nbformat.read(out_dir / "notebooks" / "capacity.ipynb", as_version=4)
    return "".join(output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", []))


@pytest.mark.slow
def test_the_notebook_writes_nothing_for_a_sweep_without_an_emulated_size(tmp_path):
    assert run_notebook("capacity", FIXTURE, tmp_path)
    assert "no emulated device size (env.device_memory_gb) in this sweep" in notebook_text(tmp_path)
    assert [path.relative_to(tmp_path) for path in tmp_path.rglob("*") if path.is_file()] == \
        [Path("notebooks/capacity.ipynb")]


@pytest.mark.slow
def test_the_notebook_writes_what_the_library_writes(ladder_dir, tmp_path):
    assert run_notebook("capacity", ladder_dir, tmp_path / "notebook")
    library = capacity.write_capacity_report(ladder_dir, tmp_path / "library")
    for path in text_files(library):
        written = tmp_path / "notebook" / path.relative_to(tmp_path / "library")
        assert written.read_bytes() == path.read_bytes(), path.name
    n_points = sum(len(runs) for ladder in LADDER.values() for runs in ladder.values())
    assert f"capacity at an emulated 24 GB: {n_points} point(s)" in notebook_text(tmp_path / "notebook")
