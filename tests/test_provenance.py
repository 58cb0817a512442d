"""env.json names the code that ran (harness/contract/envinfo.py): its commit and, where the tree differed, the
modified tracked files and the hash of `git diff HEAD`, whose text the driver keeps as git.diff; untracked and
ignored files and the run's own outputs never count."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from harness.contract import envinfo
from harness.driver.app import build_summary


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A checkout with one commit: code.py and a tracked run dir (results/run/summary.json), an ignored folder."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("multirun/\n")
    (tmp_path / "results" / "run").mkdir(parents=True)
    (tmp_path / "results" / "run" / "summary.json").write_text("{}\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(envinfo, "REPO_ROOT", tmp_path.resolve())
    return tmp_path


def test_a_clean_tree_names_its_commit_alone_whatever_is_untracked_ignored_or_the_runs_own(repo):
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "multirun").mkdir()
    (repo / "multirun" / "out.json").write_text("{}\n")
    (repo / "results" / "run" / "summary.json").write_text('{"status": "ok"}\n')  # the run writing its own file
    facts, diff = envinfo.git_state(repo / "results" / "run")
    assert facts == {"git_sha": git(repo, "rev-parse", "HEAD").strip(), "git_dirty": False, "git_dirty_files": [],
                     "git_diff_sha256": None}
    assert diff is None


def test_a_dirty_tree_names_the_modified_files_and_the_hash_of_the_diff_it_keeps(repo):
    (repo / "code.py").write_text("x = 2\n")
    facts, diff = envinfo.git_state(repo / "multirun" / "run")
    assert facts["git_dirty"] is True and facts["git_dirty_files"] == ["code.py"]
    assert "-x = 1" in diff and "+x = 2" in diff
    assert facts["git_diff_sha256"] == hashlib.sha256(diff.encode()).hexdigest()
    assert diff == git(repo, "diff", "HEAD", "--binary")  # the text a reader applies to the commit


def test_summary_json_records_how_far_the_point_went_over_its_budget():
    config = {"train": {"warmup_steps": 0}}
    rows = [{"step": step, "phase": 0, "phase_step": step, "step_time_s": 0.1, "peak_allocated_bytes": peak}
            for step, peak in enumerate((14 * 10**9, 12 * 10**9, 12 * 10**9))]
    facts = {"budget_bytes": 11 * 10**9, "predicted_peak_bytes": 11_500_000_000}
    assert build_summary(config, "ok", None, rows, 1.0, facts)["over_budget_bytes"] == 10**9  # measured, past step 0
    assert build_summary(config, "oom", "out", rows, 1.0, facts)["over_budget_bytes"] == 500_000_000  # the plan alone
    assert build_summary(config, "ok", None, rows, 1.0, {})["over_budget_bytes"] is None  # no budget
