"""The ops a point built just in time (harness/driver/op_builds.py): a library written after the launch counts
from the later of the launch and its build file to the library; an op already built, an op whose link never
happened and folders that are no op builds count nothing."""
import os
import sys
from pathlib import Path

import pytest

from harness.driver import launch, op_builds

LAUNCH = 1_000_000.0


def op(root: Path, name: str, build_file_at: float, library_at: float | None) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / op_builds.BUILD_FILE).write_text("rule link\n")
    os.utime(folder / op_builds.BUILD_FILE, (build_file_at, build_file_at))
    if library_at is not None:
        (folder / f"{name}.so").write_bytes(b"\x7fELF")
        os.utime(folder / f"{name}.so", (library_at, library_at))


def test_only_the_libraries_linked_since_the_launch_count_from_their_build_start(tmp_path):
    op(tmp_path, "fused_adam", LAUNCH + 10, LAUNCH + 70)  # built by this point: 60 s
    op(tmp_path / "py312_cu130", "cpu_adam", LAUNCH + 5, LAUNCH + 40)  # torch's default layout, one level down
    op(tmp_path, "quantizer", LAUNCH + 12, LAUNCH - 3600)  # built by an earlier point; torch rewrote build.ninja
    op(tmp_path, "broken", LAUNCH + 2, None)  # its link failed: no library
    op(tmp_path, "begun_before", LAUNCH - 20, LAUNCH + 15)  # a build under way at the launch counts from it
    (tmp_path / "notes").mkdir()
    assert op_builds.build_seconds(tmp_path, LAUNCH) == pytest.approx(60 + 35 + 15)
    assert op_builds.build_seconds(tmp_path, LAUNCH + 100) == 0.0
    assert op_builds.build_seconds(tmp_path / "absent", LAUNCH) == 0.0


@pytest.mark.slow
def test_a_launch_reports_the_builds_its_processes_made(tmp_path):
    root = tmp_path / "extensions"
    folder = root / "fake_op"
    script = (f"import os, time; os.makedirs({str(folder)!r}, exist_ok=True); "
              f"open({str(folder / op_builds.BUILD_FILE)!r}, 'w').close(); time.sleep(0.3); "
              f"open({str(folder / 'fake_op.so')!r}, 'w').close()")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    result = launch.run_workers([sys.executable, "-c", script], env, tmp_path, timeout_s=60)
    assert result.returncode == 0 and 0.25 < result.op_build_s < 5.0
    again = launch.run_workers([sys.executable, "-c", "pass"], env, tmp_path, timeout_s=60)
    assert again.op_build_s == 0.0  # already built: nothing this time
