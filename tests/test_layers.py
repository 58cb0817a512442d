"""The floors of the code, read from its imports (AST, so imports inside functions count too): the analysis reads
run files through the contract alone, and the contract and the offload pass import nothing above them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def harness_imports(path: Path) -> set[str]:
    """Every harness module a file imports, as a dotted name (`from harness import x` names harness.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("harness.")}


def outside(paths: list[Path], allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """Each file's harness imports that are not under an allowed package."""
    found = {}
    for path in paths:
        bad = sorted(name for name in harness_imports(path)
                     if not any(name == package or name.startswith(package + ".") for package in allowed))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_analysis_imports_only_the_contract_and_the_arm_registry():
    paths = [*ROOT.glob("analysis/*.py"), *ROOT.glob("analysis/notebooks/*.py")]
    assert len(paths) > 10
    assert outside(paths, ("harness.contract", "harness.arms")) == {}


@pytest.mark.parametrize("package, allowed", [
    ("harness/contract", ("harness.contract", "harness.arms")),  # the schema's arm group is the arm's class
    ("harness/offload", ("harness.contract", "harness.offload")),
])
def test_a_lower_floor_imports_nothing_above_it(package, allowed):
    assert outside(sorted((ROOT / package).rglob("*.py")), allowed) == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.driver import launch\n    import harness.rank.worker\n")
    assert harness_imports(module) == {"harness.driver.launch", "harness.rank.worker"}
