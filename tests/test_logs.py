"""One logger: `logging` under `harness`, a rank's lines prefixed by its rank, the level from launcher.log_level;
print is left to the driver's console and the command-line tools."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from harness.contract import logs

ROOT = Path(__file__).resolve().parents[1]
# Where a print is the point: the driver's console (its table and status lines), the command-line entry points,
# and the report's notebooks and their shared set-up, whose printed lines are the report's cell output.
PRINTING = {"harness/driver/console.py", "harness/cli.py", "harness/offload/plan_cli.py", "harness/cluster/preview.py",
            "analysis/bench.py", "analysis/report.py", "analysis/archive.py", "analysis/notebook.py",
            "analysis/fixtures/make_fixture.py"}


@pytest.fixture
def restored():
    yield
    logs.setup()


def test_a_ranks_lines_carry_its_rank_and_the_level_holds_back_the_rest(capsys, restored):
    logs.setup("WARNING", rank=1)
    logging.getLogger("harness.rank.worker").info("worker: hidden")
    logging.getLogger("harness.rank.worker").warning("worker: shown")
    logging.getLogger(logs.PROGRESS).info("step 1/6 phase 0")
    out, err = capsys.readouterr()
    assert err == "[rank 1] worker: shown\n"
    assert out == "step 1/6 phase 0\n"  # the progress line stays bare: the driver echoes lines starting 'step '


def test_the_drivers_lines_have_no_prefix_and_info_goes_to_stdout(capsys, restored):
    logs.setup("INFO")
    logging.getLogger("harness.driver.sinks").info("sweep index: x")
    assert capsys.readouterr().out == "sweep index: x\n"


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="LOUD"):
        logs.setup("LOUD")


def prints(path: Path) -> list[int]:
    """Lines of the calls to print in a file."""
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_nothing_prints_outside_the_console_and_the_command_line_tools():
    files = [path for folder in ("harness", "analysis") for path in (ROOT / folder).rglob("*.py")]
    found = {str(path.relative_to(ROOT)): lines for path in files if (lines := prints(path))}
    found = {path: lines for path, lines in found.items()
             if path not in PRINTING and not path.startswith("analysis/notebooks/")}
    assert found == {}


def test_the_print_check_finds_a_print(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    print('x')\n")
    assert prints(tmp_path / "m.py") == [2]
