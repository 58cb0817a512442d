"""Micro-batches at one global batch (experiments=accumulation): the table per optimizer step with the offload
cycles, the throughput figure with an x where an arm first ran out, and the other tables and figures of the same
sweep, whose series must not split by the gradient accumulation that follows the micro-batch."""
import statistics
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from analysis import accumulation, capacity  # noqa: E402
from analysis.fixtures.synthetic import write_point  # noqa: E402
from analysis.load import load_sweep  # noqa: E402
from analysis.throughput_figures import throughput_vs_micro_batch  # noqa: E402
from analysis.report import run_notebook  # noqa: E402
from analysis.tables import throughput_table  # noqa: E402

GLOBAL_BATCH, SEQ, SIZE, COMPILE = 16, 512, 16.0, 5.0
OOM_P1 = {"stage": "step", "phase": 1, "step": 5, "requested_bytes": 10**9, "free_bytes": 10**8}
# arm -> micro-batch -> each repeat's final-phase step times (per optimizer step), or how it failed
CAMPAIGN = {
    "deepcompile": {1: [(0.50, 0.52, 0.51)], 2: [(0.40, 0.40, 0.40)], 4: [(0.35, 0.36, 0.35)], 8: [OOM_P1]},
    "ds_offload": {1: [(2.0, 2.1, 2.0)], 2: [(1.2, 1.2, 1.2)], 4: [(0.8, 0.8, 0.8)], 8: [(0.6, 0.6, 0.6)]},
    "offload": {1: [(0.7, 0.7, 0.7), (0.8, 0.8, 0.8)], 2: [(0.5, 0.5, 0.5)], 4: [(0.45, 0.45, 0.45)],
                8: [(0.42, 0.42, 0.42)]},
}
OFFLOADED = {"ds_offload": None, "offload": 3 * 10**9}  # ds_offload's op stats count no bytes
pytestmark = pytest.mark.usefixtures("close_figures")


def cycles(arm, micro_batch):
    """Cycles per optimizer step: DeepSpeed's pass every micro-batch, ours once."""
    return {"ds_offload": GLOBAL_BATCH // micro_batch, "offload": 1}.get(arm)


def write_campaign(sweep_dir: Path) -> None:
    job = 0
    for arm, ladder in CAMPAIGN.items():
        for micro_batch, runs in ladder.items():
            for repeat, run in enumerate(runs):
                failed = isinstance(run, dict)
                write_point(sweep_dir, job, arm=arm, micro_batch=micro_batch, grad_accum=GLOBAL_BATCH // micro_batch,
                            seq_len=SEQ, repeat=repeat, device_memory_gb=SIZE,
                            status="oom" if failed else "ok", oom=run if failed else None,
                            phase_times=[(COMPILE, 0.3)] if failed else [(COMPILE, 0.3), (COMPILE, *run)],
                            offload_bytes=OFFLOADED.get(arm), offload_cycles=cycles(arm, micro_batch),
                            extra={"experiments/accumulation_rows": f"mb{micro_batch}"})
                job += 1
    # another sweep's point, at one accumulation only: no micro-batches compared at its global batch
    write_point(sweep_dir, job, arm="offload", micro_batch=2, seq_len=SEQ, device_memory_gb=SIZE)


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("accumulation")
    write_campaign(sweep_dir)
    return load_sweep(sweep_dir).points


def tokens_per_s(arm, micro_batch):
    """The median over repeats of each run's final-phase median tokens/s."""
    return statistics.median(GLOBAL_BATCH * SEQ / statistics.median(run) for run in CAMPAIGN[arm][micro_batch])


def test_only_global_batches_at_which_the_accumulation_varies_are_compared(points):
    assert accumulation.global_batches(points) == [GLOBAL_BATCH]
    assert accumulation.global_batches(points.iloc[0:0]) == []
    assert len(accumulation.points_at(points, GLOBAL_BATCH)) == len(points) - 1
    assert accumulation.accumulation_lines(points) == [
        f"accumulation at {GLOBAL_BATCH} sequences per GPU per optimizer step: {len(points) - 1} point(s)"]


def test_table_shows_each_arm_per_optimizer_step_with_its_offload_cycles(points):
    table = accumulation.accumulation_table(points, GLOBAL_BATCH)
    assert table.name == "accumulation_16seq"
    assert [group for group, _ in table.display.columns][1::4] == ["mb 1 (GA 16)", "mb 2 (GA 8)", "mb 4 (GA 4)",
                                                                  "mb 8 (GA 2)"]
    assert [name for _, name in table.display.columns][:5] == ["arm", "s/step", "tok/s", "offloaded/step (GB)",
                                                               "cycles/step"]
    rows = {row[0]: row[1:] for row in table.display.values.tolist()}
    assert list(rows) == ["deepcompile", "ds_offload", "offload"]  # one row per arm: GA follows the micro-batch
    assert rows["deepcompile"][:4] == ["0.51", "16063", "-", "-"] and rows["deepcompile"][12:] == ["OOM (p1)"] * 4
    assert rows["ds_offload"][3::4] == ["16", "8", "4", "2"]  # every micro-batch
    assert rows["offload"][3::4] == ["1", "1", "1", "1"] and rows["offload"][2] == "3"
    assert rows["offload"][0] == "0.75 [0.7, 0.8]"  # the median over repeats, with their range
    assert "per optimizer step" in table.caption


def test_the_cuts_rows_named_per_arm_follow_the_micro_batch_and_split_no_arm(tmp_path):
    """experiments/accumulation_cut names each row by arm and micro-batch (ours_mb1, ds_mb1, ...): within an arm it
    follows the micro-batch, so each arm is one row of the table and one series of the figure."""
    short = {"deepcompile": "dc", "ds_offload": "ds", "offload": "ours"}
    for job, (arm, micro_batch) in enumerate((("offload", 1), ("ds_offload", 1), ("offload", 4), ("ds_offload", 4),
                                              ("deepcompile", 2))):
        write_point(tmp_path, job, arm=arm, micro_batch=micro_batch, grad_accum=GLOBAL_BATCH // micro_batch,
                    seq_len=SEQ, device_memory_gb=SIZE, phase_times=[(COMPILE, 0.3), (COMPILE, 0.5, 0.5)],
                    offload_cycles=cycles(arm, micro_batch),
                    extra={"experiments/accumulation_cut": f"{short[arm]}_mb{micro_batch}"})
    cut = load_sweep(tmp_path).points
    table = accumulation.accumulation_table(cut, GLOBAL_BATCH)
    assert [row[0] for row in table.display.values.tolist()] == ["deepcompile", "ds_offload", "offload"]
    plot = accumulation.accumulation_plot(cut, GLOBAL_BATCH)
    drawn = plot.data[plot.data["kind"] == "tokens_per_s"]
    assert set(drawn["series"]) == {"deepcompile", "ds_offload", "offload"}
    assert drawn[drawn["series"] == "offload"]["x"].tolist() == [1, 4]


def test_figure_draws_tokens_per_s_against_the_micro_batch_and_an_x_at_the_first_oom(points):
    plot = accumulation.accumulation_plot(points, GLOBAL_BATCH)
    drawn = plot.data[plot.data["kind"] == "tokens_per_s"]
    assert set(drawn["series"]) == {"deepcompile", "ds_offload", "offload"}
    ours = drawn[drawn["series"] == "offload"]
    assert ours["x"].tolist() == [1, 2, 4, 8]
    assert np.allclose(ours["y"], [tokens_per_s("offload", mb) for mb in (1, 2, 4, 8)])
    [oom] = plot.data[plot.data["kind"] == "first_oom"].to_dict("records")
    assert (oom["series"], oom["x"]) == ("deepcompile", 8) and oom["y"] == pytest.approx(tokens_per_s("deepcompile", 4))
    ax = plot.figure.axes[0]
    assert "16 sequences per GPU" in ax.get_title() and "emulated 16 GB device" in ax.get_title()
    assert "gradient accumulation = 16 / micro-batch" in ax.get_xlabel()
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1", "2", "4", "8"]


def test_the_other_tables_and_figures_keep_one_series_per_arm(points):
    at_batch = accumulation.points_at(points, GLOBAL_BATCH)
    assert [row[0] for row in throughput_table(at_batch).display.values.tolist()] == \
        ["deepcompile", "ds_offload", "offload"]
    assert [row[0] for row in capacity.capacity_table(at_batch, SIZE).display.values.tolist()] == \
        ["deepcompile", "ds_offload", "offload"]
    assert set(throughput_vs_micro_batch(at_batch).data["series"]) == {"deepcompile", "ds_offload", "offload"}


@pytest.mark.slow
def test_the_notebook_writes_what_the_library_writes_and_nothing_without_such_points(points, tmp_path):
    assert run_notebook("throughput", Path(points["sweep"].iloc[0]), tmp_path / "notebook")
    library = accumulation.write_accumulation_files(points, tmp_path / "library")
    assert sorted(str(path.relative_to(tmp_path / "library")) for path in library if path.suffix != ".png") == [
        "figures/accumulation_throughput_16seq.pdf", "figures/accumulation_throughput_16seq_data.csv",
        "tables/accumulation_16seq.csv", "tables/accumulation_16seq.md", "tables/accumulation_16seq.tex",
        "tables/accumulation_16seq_values.csv"]
    for path in library:
        if path.suffix in (".md", ".tex", ".csv"):
            assert (tmp_path / "notebook" / path.relative_to(tmp_path / "library")).read_bytes() == path.read_bytes()
    fixture = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"
    assert accumulation.write_accumulation_files(load_sweep(fixture).points, tmp_path / "none") == []
