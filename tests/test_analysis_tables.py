"""Paper tables: repeats as median with spread, failures by status, speed-ups, stable bytes on disk."""
import re
import statistics

import pandas as pd
import pytest

from analysis.design import design
from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.render import to_latex, to_markdown, write_table
from analysis.memory_tables import memory_table
from analysis.measurement import with_reserved_growth
from analysis.tables import budget_table, policies_table, swept_axis, throughput_table

COMPILE = 5.0  # every synthetic phase starts with a compile step this long; the medians must leave it out


def steady(seconds):
    """A phase whose measured steps all take `seconds`."""
    return (COMPILE, seconds, seconds, seconds)


def display_cell(table, row_label, column):
    display = table.display
    rows = display[("", "arm")] == row_label
    assert rows.sum() == 1, f"no single row {row_label!r} in {list(display[('', 'arm')])}"
    return display.loc[rows, column].item()


@pytest.fixture
def mixed_sweep(tmp_path):
    """zero3 at mb 2 (three repeats) and mb 4 (OOM); deepcompile skipped; offload fast at mb 2, one of
    two repeats dead at mb 4."""
    write_point(tmp_path, 0, arm="zero3", micro_batch=2, repeat=0, phase_times=[(COMPILE, 0.4, 0.3, 0.5)])
    write_point(tmp_path, 1, arm="zero3", micro_batch=2, repeat=1, phase_times=[(COMPILE, 0.9, 1.0, 0.8)])
    write_point(tmp_path, 2, arm="zero3", micro_batch=2, repeat=2, phase_times=[(COMPILE, 0.6, 0.5, 0.4)])
    write_point(tmp_path, 3, arm="zero3", micro_batch=4, status="oom", reason="CUDA out of memory",
                phase_times=[(COMPILE,)])
    write_point(tmp_path, 4, arm="deepcompile", micro_batch=2, status="skipped", phase_times=[])
    write_point(tmp_path, 5, arm="offload", micro_batch=2, budget_gb=4.0, phase_times=[steady(0.2), steady(0.125)])
    write_point(tmp_path, 6, arm="offload", micro_batch=4, budget_gb=4.0, phase_times=[steady(0.3), steady(0.25)])
    write_point(tmp_path, 7, arm="offload", micro_batch=4, budget_gb=4.0, repeat=1, status="died",
                reason="Signal 9", phase_times=[steady(0.3)])
    return load_sweep(tmp_path)


def test_repeats_fold_into_their_median_with_min_and_max(mixed_sweep):
    table = throughput_table(mixed_sweep.points)
    per_repeat = [statistics.median(times) for times in ((0.4, 0.3, 0.5), (0.9, 1.0, 0.8), (0.6, 0.5, 0.4))]
    zero3 = table.values[(table.values["arm"] == "zero3") & (table.values["micro_batch"] == 2)].iloc[0]
    assert zero3["final_step_time_s_median"] == statistics.median(per_repeat) == 0.5
    assert (zero3["final_step_time_s_median_min"], zero3["final_step_time_s_median_max"]) == (0.4, 0.9)
    assert (zero3["n_runs"], zero3["n_ok"]) == (3, 3)
    assert display_cell(table, "zero3", ("mb 2", "s/step")) == "0.5 [0.4, 0.9]"


def test_failed_points_show_their_status_never_a_number(mixed_sweep):
    table = throughput_table(mixed_sweep.points)
    for column in ("s/step", "tok/s", "vs zero3", "vs best base"):
        assert display_cell(table, "zero3", ("mb 4", column)) == "OOM"
        assert display_cell(table, "deepcompile", ("mb 2", column)) == "SKIPPED"
    assert display_cell(table, "deepcompile", ("mb 4", "s/step")) == "-"  # never run
    # one of two repeats died: the ok repeat's number, and the death beside it
    assert display_cell(table, "offload", ("mb 4", "s/step")) == "0.25 (+DIED)"
    memory = memory_table(mixed_sweep.points)
    oom_row = memory.display[memory.display[("", "arm")] == "zero3, micro_batch=4"].iloc[0]
    assert list(oom_row[[("", "peak allocated (GB)"), ("", "peak reserved (GB)")]]) == ["OOM", "OOM"]


def test_speedups_against_zero3_and_the_best_non_offload_arm_where_both_ran(tmp_path):
    write_point(tmp_path, 0, arm="zero3", micro_batch=2, phase_times=[steady(1.0)])
    write_point(tmp_path, 1, arm="deepcompile", micro_batch=2, phase_times=[steady(0.8), steady(0.5)])
    write_point(tmp_path, 2, arm="offload", micro_batch=2, phase_times=[steady(0.25)])
    write_point(tmp_path, 3, arm="zero3", micro_batch=4, status="oom", phase_times=[])
    write_point(tmp_path, 4, arm="offload", micro_batch=4, phase_times=[steady(0.4)])
    table = throughput_table(load_sweep(tmp_path).points)
    assert display_cell(table, "offload", ("mb 2", "vs zero3")) == "4.00x"
    assert display_cell(table, "offload", ("mb 2", "vs best base")) == "2.00x"  # deepcompile's 0.5 s
    assert display_cell(table, "deepcompile", ("mb 2", "vs zero3")) == "2.00x"
    assert display_cell(table, "offload", ("mb 4", "vs zero3")) == "-"  # zero3 did not run there
    offload = table.values[table.values["arm"] == "offload"].set_index("micro_batch")
    assert offload.loc[2, "speedup_vs_zero3"] == 4.0 and pd.isna(offload.loc[4, "speedup_vs_zero3"])


def test_the_swept_axis_is_sequence_length_when_it_varies(tmp_path):
    for job, seq_len in enumerate((2048, 512)):
        write_point(tmp_path, job, seq_len=seq_len, phase_times=[steady(0.1 * (job + 1))])
    points = load_sweep(tmp_path).points
    assert swept_axis(points) == "seq_len"
    groups = list(dict.fromkeys(group for group, _ in throughput_table(points).display.columns if group))
    assert groups == ["seq 512", "seq 2048"]


def test_knobs_of_one_arm_and_fault_injection_do_not_split_design_points(tmp_path):
    write_point(tmp_path, 0, arm="zero3", micro_batch=2)
    write_point(tmp_path, 1, arm="zero3", micro_batch=4, status="died", extra={"debug.fault": "kill"})
    write_point(tmp_path, 2, arm="deepcompile", micro_batch=2, extra={"arm.schedule": "z3_only"})
    write_point(tmp_path, 3, arm="offload", micro_batch=2, budget_gb=4.0)
    write_point(tmp_path, 4, arm="offload", micro_batch=2, budget_gb=None)  # auto: a budget of its own
    points = load_sweep(tmp_path).points
    points_design = design(points)
    assert points_design.keys == ["arm", "micro_batch", "budget_gb"]
    labels = [points_design.label(row) for row in points.to_dict("records")]
    # a budget beside none: each named by the config, the one given none by its rule (unknown here: no auto_rule)
    assert labels == ["zero3, micro_batch=2", "zero3, micro_batch=4", "deepcompile", "offload @ 4 GB",
                      "offload (auto)"]


def test_memory_table_has_every_phase_in_gb_of_1e9_bytes(tmp_path):
    write_point(tmp_path, 0, arm="offload", phase_times=[steady(0.2), steady(0.1)], peak_reserved=3 * 2**30,
                offload_bytes=2**29)
    table = memory_table(load_sweep(tmp_path).points)
    assert list(table.display[("", "phase")]) == ["0", "1"]
    # the synthetic peak of step s is 3 GiB + s bytes: phase 1's last step is step 7
    assert list(table.values["peak_reserved_bytes_max"]) == [3 * 2**30 + 3, 3 * 2**30 + 7]
    assert list(table.display[("", "peak reserved (GB)")]) == ["3.221", "3.221"]  # 3 GiB is 3.221e9 bytes
    assert list(table.display[("", "offloaded/step (GB)")]) == ["0.5369", "0.5369"]


def test_policies_table_crosses_empty_cache_with_copy_streams(tmp_path):
    policies = [("never", "split", 0.2), ("never", "single", 0.3), ("per_step", "split", 0.25),
                ("per_step", "single", 0.35)]
    for job, (empty_cache, streams, seconds) in enumerate(policies):
        write_point(tmp_path, job, arm="offload", empty_cache=empty_cache, streams=streams,
                    phase_times=[steady(seconds)])
    sweep = load_sweep(tmp_path)
    table = policies_table(with_reserved_growth(sweep.points, sweep.steps))
    assert list(table.display[("", "empty_cache")]) == ["never", "per_step"]
    assert list(table.display[("streams single", "s/step")]) == ["0.3", "0.35"]
    assert list(table.display[("streams split", "s/step")]) == ["0.2", "0.25"]
    # the synthetic default peak is 3 GiB (+ the step's number in bytes): 3.221 GB
    assert list(table.display[("streams split", "peak reserved (GB)")]) == ["3.221", "3.221"]
    # ...so reserved memory grew by the steps between the first measured step and the last, bytes apiece
    measured = [row for row in sweep.steps.to_dict("records") if row["run_dir"] == sweep.points["run_dir"][0]
                and row["phase_step"] > 0]
    assert measured[-1]["step"] > measured[0]["step"]
    assert table.values["final_reserved_growth_bytes"].tolist() == [measured[-1]["step"] - measured[0]["step"]] * 4
    assert policies_table(sweep.points).display[("streams split", "reserved growth (GB)")].tolist() == ["-", "-"]


def test_budget_table_lists_offload_arms_by_budget(tmp_path):
    write_point(tmp_path, 0, arm="zero3", phase_times=[steady(1.0)])
    for job, budget in enumerate((8.0, 2.0), start=1):
        write_point(tmp_path, job, arm="offload", budget_gb=budget, offload_bytes=int((10 - budget) * 1e9),
                    phase_times=[steady(budget / 10)])
    write_point(tmp_path, 3, arm="offload", budget_gb=1.0, status="oom", phase_times=[])
    table = budget_table(load_sweep(tmp_path).points)
    assert table.display[[("", "budget (GB)"), ("", "offloaded/step (GB)"), ("", "s/step"),
                          ("", "vs best base")]].values.tolist() == [
        ["1", "OOM", "OOM", "OOM"], ["2", "8", "0.2", "5.00x"], ["8", "2", "0.8", "1.25x"]]


def test_written_tables_are_byte_identical_booktabs_markdown_and_csv(mixed_sweep, tmp_path):
    first = write_table(throughput_table(mixed_sweep.points), tmp_path / "first")
    again = write_table(throughput_table(load_sweep(mixed_sweep.points["sweep"][0]).points), tmp_path / "again")
    assert [path.name for path in first] == ["throughput.md", "throughput.tex", "throughput.csv",
                                             "throughput_values.csv"]
    assert [path.read_bytes() for path in first] == [path.read_bytes() for path in again]
    tex = first[1].read_text()
    assert re.search(r"\\toprule\n.*\\multicolumn\{4\}\{c\}\{mb 2\}.*\n\\cmidrule\(lr\)\{2-5\}", tex)
    assert "\\midrule" in tex and tex.endswith("\\bottomrule\n\\end{tabular}\n")
    markdown = first[0].read_text().splitlines()
    assert markdown[0].startswith("| arm | mb 2 s/step |") and markdown[1].startswith("| --- | ---: |")
    assert len(markdown) == 2 + 3  # header, rule, one line per arm
    csv = pd.read_csv(first[2], dtype=str, keep_default_na=False)
    assert csv.loc[csv["arm"] == "zero3", "mb 4 s/step"].item() == "OOM"


def test_latex_and_markdown_escape_what_they_must():
    display = pd.DataFrame([["zero_offload", "a|b", "50%"]],
                           columns=pd.MultiIndex.from_tuples([("", "arm"), ("", "x"), ("", "y")]))
    assert "zero\\_offload & a|b & 50\\% \\\\" in to_latex(display)
    assert "| zero_offload | a\\|b | 50% |" in to_markdown(display)


def test_speedups_compare_points_under_the_same_emulated_device(tmp_path):
    write_point(tmp_path, 0, arm="zero3", device_memory_gb=24.0, phase_times=[steady(1.0)])
    write_point(tmp_path, 1, arm="zero3", device_memory_gb=80.0, phase_times=[steady(0.5)])
    write_point(tmp_path, 2, arm="offload", device_memory_gb=24.0, phase_times=[steady(0.25)])
    table = throughput_table(load_sweep(tmp_path).points)
    assert display_cell(table, "offload", ("seq 64", "vs zero3")) == "4.00x"  # 24 GB zero3, not 80 GB
    assert display_cell(table, "zero3, device_memory_gb=80", ("seq 64", "vs zero3")) == "1.00x"


def test_transfers_table_lists_only_points_that_measured_their_copies():
    from pathlib import Path

    from analysis.memory_tables import has_transfers, transfers_table

    sweep = load_sweep(Path(__file__).resolve().parents[1] / "results" / "capacity" / "sweep")
    measured = sweep.points[sweep.points["final_offload_stall_s_median"].notna()]
    assert has_transfers(sweep.points) and 0 < len(measured) < len(sweep.points)  # deepcompile has no copies
    table = transfers_table(sweep.points)
    assert len(table.display) == len(measured)
    waits = sorted(float(text) for text in table.display[("", "compute waits (s)")])
    assert waits == pytest.approx(sorted(measured["final_offload_stall_s_median"]), rel=1e-3)
    assert not has_transfers(sweep.points[sweep.points["arm"] == "deepcompile"])
