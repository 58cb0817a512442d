"""`harness archive` (analysis/archive.py): a sweep's kept run files copied for committing under results/, a profiled
step's trace kept as its sums, which the reader reads as it reads the trace; nothing else comes along, nothing is
overwritten, and a file it may not read stops it before anything is written."""
import gzip
import json
import os
import re
import shutil
import time

import pytest

from analysis.archive import KEPT, MAX_FILE_BYTES, ArchiveError, archive, main
from analysis.columns import PROFILED_COLUMNS
from analysis.load import load_sweep
from conftest import REPO_ROOT
from harness.contract import runfiles
from harness.contract.profiled_step import NotAProfiledStep, from_record, profiled_step
from harness.driver.stop_at import reason_to_skip
from harness.offload.profile import load_profile
from test_nothing_to_move import trace

CAPACITY = REPO_ROOT / "results" / "capacity" / "sweep"
POINTS = ("0_arm=offload,train.seq_len=1024", "12_arm=deepcompile,train.seq_len=1024")


@pytest.fixture
def sweep(tmp_path):
    """Two committed capacity points as a fresh sweep: index lines, a profiled step's trace on ours, and what a run
    dir holds that a campaign never keeps (log, W&B folder, allocator snapshot, an earlier attempt)."""
    sweep_dir = tmp_path / "multirun"
    sweep_dir.mkdir()
    for name in POINTS:
        shutil.copytree(CAPACITY / name, sweep_dir / name)
    index = [line for line in (CAPACITY / runfiles.INDEX).read_text().splitlines()
             if json.loads(line)["run_dir"] in POINTS]
    (sweep_dir / runfiles.INDEX).write_text("\n".join(index) + "\n")
    ours = sweep_dir / POINTS[0]
    (ours / runfiles.TORCH_TRACE).write_text(json.dumps(trace(sync_us=900.0)))
    (ours / runfiles.LOG).write_text("log\n")
    (ours / runfiles.MEMORY_SNAPSHOT).write_bytes(b"\x80\x04pickle")
    (ours / runfiles.WANDB_DIR).mkdir()
    (ours / runfiles.ATTEMPTS_DIR / "0").mkdir(parents=True)
    (ours / runfiles.ATTEMPTS_DIR / "0" / runfiles.SUMMARY).write_text("{}")
    return sweep_dir


def test_the_kept_files_come_along_and_the_trace_as_its_sums_which_the_reader_reads_alike(sweep, tmp_path):
    out = tmp_path / "results" / "sweep"
    (sweep / "2_unfinished").mkdir()  # a point its call's end killed: config, no summary
    shutil.copy(sweep / POINTS[0] / runfiles.CONFIG, sweep / "2_unfinished" / runfiles.CONFIG)
    skipped = sweep / "3_skipped"  # one sweep.stop_at kept from starting: a summary, no result
    skipped.mkdir()
    shutil.copy(sweep / POINTS[0] / runfiles.CONFIG, skipped / runfiles.CONFIG)
    reason = reason_to_skip(time.time() + 10, skipped, sweep)
    (skipped / runfiles.SUMMARY).write_text(json.dumps({"status": "skipped", "reason": reason}))
    assert archive(sweep, out) == (list(POINTS), ["2_unfinished", "3_skipped"])
    assert not (out / "2_unfinished").exists() and not (out / "3_skipped").exists()
    shutil.rmtree(skipped)  # the reader lists a skipped point; the comparison below is of the archived ones
    ours = out / POINTS[0]
    assert {path.name for path in ours.iterdir()} == {*(name for name in KEPT if (sweep / POINTS[0] / name).exists()),
                                                       runfiles.PROFILED_STEP}
    for name in KEPT:
        if (sweep / POINTS[0] / name).exists():
            assert (ours / name).read_bytes() == (sweep / POINTS[0] / name).read_bytes()
    assert json.loads((ours / runfiles.PROFILED_STEP).read_text())["sync_s"] == pytest.approx(900e-6)
    assert (out / runfiles.INDEX).read_text() == (sweep / runfiles.INDEX).read_text()

    original, archived = load_sweep(sweep), load_sweep(out)
    assert not archived.problems
    columns = ["run_dir", *PROFILED_COLUMNS.values()]
    assert archived.points[columns].equals(original.points[columns])
    assert archived.points[PROFILED_COLUMNS["sync_s"]].notna().sum() == 1


def test_a_profile_as_a_rank_wrote_it_is_committed_gzipped_and_plans_alike_from_either(sweep, tmp_path):
    ours = sweep / POINTS[0]
    written = load_profile(ours / runfiles.ARCHIVED_PROFILE)
    (ours / runfiles.ARCHIVED_PROFILE).unlink()
    (ours / runfiles.PROFILE).write_text(json.dumps(written, indent=2))  # as graph_pass writes it
    out = tmp_path / "out"
    archive(sweep, out)
    committed = out / POINTS[0] / runfiles.ARCHIVED_PROFILE
    assert not (out / POINTS[0] / runfiles.PROFILE).exists()
    assert committed.stat().st_size * 5 < (ours / runfiles.PROFILE).stat().st_size
    assert gzip.decompress(committed.read_bytes()) == (ours / runfiles.PROFILE).read_bytes()
    assert load_profile(committed) == load_profile(ours / runfiles.PROFILE)
    assert runfiles.profile_file(out / POINTS[0]) == committed and runfiles.profile_file(ours) == ours / "profile.json"


def test_a_second_archive_adds_its_points_and_never_overwrites_one(sweep, tmp_path):
    out = tmp_path / "out"
    archive(sweep, out)
    before = {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    with pytest.raises(ArchiveError, match="already archived"):
        archive(sweep, out)
    assert {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()} == before

    later = tmp_path / "later"  # a campaign's second part, folded into the same folder
    later.mkdir()
    shutil.copytree(sweep / POINTS[1], later / "2_again")
    (later / runfiles.INDEX).write_text(json.dumps({"run_dir": "2_again", "overrides": []}) + "\n")
    assert archive(later, out) == (["2_again"], [])
    assert [json.loads(line)["run_dir"] for line in (out / runfiles.INDEX).read_text().splitlines()] == \
        [*POINTS, "2_again"]


def test_a_point_the_index_does_not_list_keeps_its_overrides_so_the_reader_still_names_it(sweep, tmp_path):
    cold = sweep / "cold_offload"  # a single run set beside the sweep: Hydra's overrides, no index line
    shutil.copytree(sweep / POINTS[0], cold)
    (cold / runfiles.OVERRIDES).parent.mkdir()
    (cold / runfiles.OVERRIDES).write_text("- arm=offload\n- train.seq_len=1024\n- sweep.reuse=false\n")
    (sweep / POINTS[0] / runfiles.OVERRIDES).parent.mkdir()
    (sweep / POINTS[0] / runfiles.OVERRIDES).write_text("- arm=offload\n")
    out = tmp_path / "out"
    archive(sweep, out)
    assert (out / "cold_offload" / runfiles.OVERRIDES).read_bytes() == (cold / runfiles.OVERRIDES).read_bytes()
    assert not (out / POINTS[0] / runfiles.HYDRA_DIR).exists()  # the index holds a listed point's overrides
    points = load_sweep(out).points.set_index("run_dir")
    assert points.loc["cold_offload", "overrides"] == "arm=offload train.seq_len=1024 sweep.reuse=false"


@pytest.mark.parametrize("spoil", ["too_large", "link_out", "bad_trace"])
def test_a_file_it_may_not_read_stops_it_before_anything_is_written(sweep, tmp_path, spoil):
    ours = sweep / POINTS[1]
    if spoil == "too_large":
        (ours / runfiles.PROFILE).write_text("x" * (MAX_FILE_BYTES + 1))
    elif spoil == "link_out":
        secret = tmp_path / "secret.json"
        secret.write_text("{}")
        os.remove(ours / runfiles.ENV)
        os.symlink(secret, ours / runfiles.ENV)
    else:
        (ours / runfiles.TORCH_TRACE).write_text(json.dumps({"traceEvents": []}))
    out = tmp_path / "out"
    with pytest.raises(ArchiveError, match=re.escape(POINTS[1])):
        archive(sweep, out)
    assert not out.exists()


def test_the_command_line_exits_1_on_a_refusal_and_2_on_a_missing_sweep(sweep, tmp_path, capsys):
    assert main([str(sweep), str(tmp_path / "out")]) == 0
    assert "archived 2 point(s)" in capsys.readouterr().out
    assert main([str(sweep), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith("error: ")
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out2")]) == 2


def test_the_sums_are_read_strictly():
    sums = profiled_step(trace()).__dict__
    assert from_record(sums) == profiled_step(trace())
    for bad in ({**sums, "extra": 1}, {k: v for k, v in sums.items() if k != "syncs"}, {**sums, "syncs": 1.5},
                {**sums, "sync_s": -1.0}, {**sums, "sync_s": float("nan")}, {**sums, "syncs": True}, [1, 2]):
        with pytest.raises(NotAProfiledStep):
            from_record(bad)
