"""The run files' owner: one way to write them (whole, one mode), their names used everywhere, no Hydra in
the ranks; and GB defined once."""
import ast
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.contract import runfiles
from harness.config.compose import compose_point

REPO_ROOT = Path(__file__).resolve().parent.parent


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("content, expected", [
    ("text\n", b"text\n"), (b"\x00bytes", b"\x00bytes"),
    (lambda tmp: Path(tmp).write_text("filled by a writer that opens the path itself"),
     b"filled by a writer that opens the path itself")])
def test_every_way_of_writing_gives_the_whole_content_and_one_mode(tmp_path, content, expected, run_file_mode):
    path = tmp_path / "file"
    path.write_text("an earlier version, longer than the new one: " * 4)
    runfiles.write_atomic(path, content)
    assert path.read_bytes() == expected
    assert mode_of(path) == run_file_mode
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # no temp file left


def test_a_failed_write_keeps_the_earlier_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / runfiles.SUMMARY
    runfiles.write_json(path, {"status": "ok"})

    def fail(tmp):
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        runfiles.write_atomic(path, fail)
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [runfiles.SUMMARY]


def test_json_run_files_are_sorted_indented_and_end_with_a_newline(tmp_path):
    runfiles.write_json(tmp_path / "x.json", {"b": [2], "a": 1})
    assert (tmp_path / "x.json").read_text() == '{\n  "a": 1,\n  "b": [\n    2\n  ]\n}\n'


def test_appended_run_files_keep_every_line_and_get_the_same_mode(tmp_path, run_file_mode):
    writer = runfiles.StepWriter(tmp_path)
    writer.write({"step": 0})
    assert runfiles.read_jsonl(tmp_path / runfiles.STEPS) == [{"step": 0}]  # flushed at once
    writer.write({"step": 1})
    writer.close()
    with runfiles.open_append(tmp_path / runfiles.STEPS) as handle:
        handle.write('{"step": 2, "torn')  # a rank killed mid-line
    assert runfiles.read_jsonl(tmp_path / runfiles.STEPS) == [{"step": 0}, {"step": 1}]
    assert mode_of(tmp_path / runfiles.STEPS) == run_file_mode


def test_the_config_the_driver_writes_reads_back_the_same_without_omegaconf(tmp_path):
    """The ranks read config.yaml with plain YAML: what the driver resolved and wrote must come back unchanged,
    strings that look like numbers and numbers in exponent form included."""
    overrides = ["experiments=capacity", "train.lr=1e-4", "sweep.name='1e9'", "env.pytorch_cuda_alloc_conf=null",
                 "+extra.flag=yes"]
    config = OmegaConf.to_container(compose_point(overrides), resolve=True)
    runfiles.write_atomic(tmp_path / runfiles.CONFIG, OmegaConf.to_yaml(config))
    read = runfiles.read_config(tmp_path)
    assert read == config
    assert read["sweep"]["name"] == "1e9" and read["train"]["lr"] == 1e-4 and read["extra"]["flag"] == "yes"


@pytest.mark.slow
def test_the_worker_imports_no_hydra_and_no_omegaconf():
    code = ("import sys, harness.rank.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def project_modules() -> list[Path]:
    return [path for folder in ("harness", "analysis") for path in sorted((REPO_ROOT / folder).rglob("*.py"))]


def run_file_names() -> set[str]:
    names = {value for name, value in vars(runfiles).items() if name.isupper() and isinstance(value, str)}
    # .hydra and wandb also name other things (Hydra's folder in any path, the W&B logger)
    return names - {runfiles.HYDRA_DIR, runfiles.WANDB_DIR} | {"hydra.yaml", "overrides.yaml"}


def string_constants(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_no_module_but_the_owner_spells_a_run_file_name():
    modules = [p for p in project_modules() if p.name != "runfiles.py"]
    names = run_file_names()
    pieces = ("error.rank", ".failed.json", "worker.node")  # the names made from a rank or node number
    spelled = [f"{path.relative_to(REPO_ROOT)}:{line}: {value!r}" for path in modules
               for line, value in string_constants(path)
               if value in names or any(piece in value and len(value) < 40 for piece in pieces)]
    assert spelled == []


def test_gb_is_defined_once():
    definitions = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for path in project_modules()
                   for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assign)
                   and any(isinstance(target, ast.Name) and target.id == "GB" for target in node.targets)]
    assert definitions == ["harness/contract/units.py:3"]


def test_a_requeued_point_sets_its_earlier_attempt_aside(tmp_path):
    assert runfiles.set_aside_previous_attempt(tmp_path) is None
    for name in ("steps.jsonl", "summary.json", "worker.log", "error.rank3.json", "config.yaml"):
        (tmp_path / name).write_text(name)
    (tmp_path / "wandb").mkdir()
    (tmp_path / ".hydra").mkdir()
    first = runfiles.set_aside_previous_attempt(tmp_path)
    assert first == tmp_path / "attempts" / "0"
    assert sorted(p.name for p in first.iterdir()) == [".hydra", "config.yaml", "error.rank3.json", "steps.jsonl",
                                                        "summary.json", "wandb", "worker.log"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempts"]  # the attempt is kept whole
    (tmp_path / "config.yaml").write_text("a config error leaves only its config and summary")
    assert runfiles.set_aside_previous_attempt(tmp_path) == tmp_path / "attempts" / "1"


def test_attempts_are_numbered_after_the_last_one_whatever_was_deleted(tmp_path):
    (tmp_path / "attempts" / "1").mkdir(parents=True)  # attempts/0 was deleted by hand
    (tmp_path / "summary.json").write_text("{}")
    assert runfiles.set_aside_previous_attempt(tmp_path) == tmp_path / "attempts" / "2"
    assert (tmp_path / "attempts" / "2" / "summary.json").exists()
