"""env.json names the code that ran (harness/contract/envinfo.py): its commit and, where the tree differed, the
modified tracked files, the untracked ones where a run's code lives, and the hash of the diff from the commit to that
tree, whose text the driver keeps as git.diff; ignored files, other untracked ones and the run's own outputs never
count."""
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
    (tmp_path / ".gitignore").write_text("multirun/\nharness/*.pyc\n")
    (tmp_path / "results" / "run").mkdir(parents=True)
    (tmp_path / "results" / "run" / "summary.json").write_text("{}\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(envinfo, "REPO_ROOT", tmp_path.resolve())
    return tmp_path


def test_a_clean_tree_names_its_commit_alone_whatever_is_untracked_ignored_or_the_runs_own(repo):
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "harness").mkdir()
    (repo / "harness" / "mod.pyc").write_bytes(b"ignored")
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


def test_an_untracked_file_where_the_run_code_lives_counts_and_its_diff_creates_it(repo, tmp_path_factory):
    """A module added since the commit (on a machine that received the tree, not the commit) is code that ran."""
    (repo / "harness").mkdir()
    (repo / "harness" / "new_module.py").write_text("y = 3\n")
    (repo / "code.py").write_text("x = 2\n")
    (repo / "notes.txt").write_text("not where code lives\n")
    facts, diff = envinfo.git_state(repo / "multirun" / "run")
    assert facts["git_dirty_files"] == ["code.py", "harness/new_module.py"]
    assert facts["git_diff_sha256"] == hashlib.sha256(diff.encode()).hexdigest()
    clone = tmp_path_factory.mktemp("clone")  # the commit and the kept diff rebuild the tree that ran
    git(clone, "clone", "-q", str(repo), ".")
    subprocess.run(["git", "apply", "-"], cwd=clone, input=diff, text=True, check=True)
    assert (clone / "harness" / "new_module.py").read_text() == "y = 3\n"
    assert (clone / "code.py").read_text() == "x = 2\n" and not (clone / "notes.txt").exists()


def test_committed_campaigns_changed_since_the_commit_are_outputs_and_never_make_the_code_dirty(repo):
    (repo / "results" / "run" / "summary.json").write_text('{"status": "ok", "rebuilt": true}\n')
    (repo / "results" / "new_campaign").mkdir()
    (repo / "results" / "new_campaign" / "profile.json.gz").write_bytes(b"\x1f\x8b")
    facts, diff = envinfo.git_state(repo / "multirun" / "run")
    assert facts["git_dirty"] is False and facts["git_dirty_files"] == [] and diff is None
    (repo / "code.py").write_text("x = 2\n")  # beside a code change, the diff holds the code alone
    facts, diff = envinfo.git_state(repo / "multirun" / "run")
    assert facts["git_dirty_files"] == ["code.py"] and "results/" not in diff


def test_the_profile_reuse_key_names_the_same_code_as_resume_so_archiving_a_campaign_keeps_its_hits(repo):
    from harness.rank import profile_cache

    clean = profile_cache.harness_version()
    assert clean == {"git_sha": git(repo, "rev-parse", "HEAD").strip(), "dirty_diff": ""}
    (repo / "results" / "new_campaign").mkdir()  # a campaign archived between two calls of a sweep
    (repo / "results" / "new_campaign" / "summary.json").write_text("{}\n")
    (repo / "results" / "run" / "summary.json").write_text('{"status": "ok"}\n')
    assert profile_cache.harness_version() == clean
    (repo / "code.py").write_text("x = 2\n")  # a code change is another key
    changed = profile_cache.harness_version()
    assert changed["git_sha"] == clean["git_sha"] and changed["dirty_diff"] not in ("", None)
    assert changed["dirty_diff"] == envinfo.git_state()[0]["git_diff_sha256"][:20]


def test_summary_json_records_how_far_the_point_went_over_its_budget():
    config = {"train": {"warmup_steps": 0}}
    rows = [{"step": step, "phase": 0, "phase_step": step, "step_time_s": 0.1, "peak_allocated_bytes": peak}
            for step, peak in enumerate((14 * 10**9, 12 * 10**9, 12 * 10**9))]
    facts = {"budget_bytes": 11 * 10**9, "predicted_peak_bytes": 11_500_000_000}
    assert build_summary(config, "ok", None, rows, 1.0, facts)["over_budget_bytes"] == 10**9  # measured, past step 0
    assert build_summary(config, "oom", "out", rows, 1.0, facts)["over_budget_bytes"] == 500_000_000  # the plan alone
    assert build_summary(config, "ok", None, rows, 1.0, {})["over_budget_bytes"] is None  # no budget
