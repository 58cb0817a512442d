"""The floors of the code, read from its imports (AST, so imports inside functions count too): every module of
harness/ and analysis/ sits on a floor, imports only the floors its own may (FLOORS, the README's layout table),
and the import graph between the floors has no circle. A failure names the file, the line and the rule."""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("harness", "analysis")

# The harness floors each floor may import besides its own, lowest first.
FLOORS: dict[str, tuple[str, ...]] = {
    "contract": (),  # run files, statuses, schema, protocol, the arm names' registry
    "config": ("contract",),  # the config Hydra composes, the point folders' names
    "offload": ("contract",),  # our pass: never the arms
    "arms": ("contract", "offload"),  # our pass only inside the methods that run it (LAZY_ONLY)
    "cluster": ("contract", "config"),  # never the driver: it hands the cluster what it needs
    "rank": ("contract", "arms", "offload"),
    "driver": ("contract", "config", "arms", "cluster", "rank"),  # the rank's emulated size, machine flags, models
    "analysis": ("contract", "arms"),  # the arm registry and the classes' display traits, never a run's code
}
LAZY_ONLY = {("arms", "offload")}  # imported inside a function only, so `import harness.arms` pulls in no torch
# Commands, above every floor: they may import any of them.
ENTRY_MODULES = {"harness/__init__.py", "harness/cli.py", "harness/run.py"}
# The contract imports the standard library, yaml and numpy (stats' bootstrap); torch only inside a function
# (envinfo reads its version).
CONTRACT_PACKAGES = {"yaml", "numpy"}
CONTRACT_LAZY_PACKAGES = {"torch"}


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # dotted, absolute (`from harness import arms` is harness.arms, a third party's its module)
    lazy: bool  # inside a function


def imports(path: Path) -> list[Import]:
    """Every import of a file, with its line and whether it sits inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]) if path.is_relative_to(ROOT) else ""
    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(child.lineno, alias.name, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, package)
                ours = base.split(".")[0] in SOURCES  # `from harness.driver import launch`: the module, if one
                found.extend(Import(child.lineno, f"{base}.{alias.name}" if ours else base, lazy)
                             for alias in child.names)
            visit(child, inside)

    visit(tree, False)
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, a relative one resolved against the file's package."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def floor_of_module(module: str) -> str | None:
    """The floor an imported module is on: harness.<floor>..., analysis...; None for anything else."""
    parts = module.split(".")
    if parts[0] == "analysis":
        return "analysis"
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def floor_of_file(relative: str) -> str | None:
    """The floor a source file is on; None for a command (ENTRY_MODULES) or a file on no floor."""
    parts = Path(relative).parts
    if parts[0] == "analysis":
        return "analysis"
    return parts[1] if len(parts) > 2 and parts[1] in FLOORS else None


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for source in SOURCES for path in (root / source).rglob("*.py"))


def breaches(path: Path, relative: str) -> list[str]:
    """'file:line: imports M (rule)' for each import of one file that its floor's rule refuses."""
    floor = floor_of_file(relative)
    if floor is None:
        return []
    found = []
    for imported in imports(path):
        target = floor_of_module(imported.module)
        where = f"{relative}:{imported.line}: imports {imported.module}"
        if target is not None and target != floor and target not in FLOORS[floor]:
            allowed = f"only {', '.join(FLOORS[floor])}" if FLOORS[floor] else "no other floor"
            found.append(f"{where} (rule: {floor} imports {allowed})")
        elif (floor, target) in LAZY_ONLY and not imported.lazy:
            found.append(f"{where} at module level (rule: {floor} imports {target} only inside a function)")
        elif floor == "contract" and target is None:
            found += _contract_package_breach(imported, where)
    return found


def _contract_package_breach(imported: Import, where: str) -> list[str]:
    top = imported.module.split(".")[0]
    if top in sys.stdlib_module_names or top in CONTRACT_PACKAGES or top == "harness":
        return []
    if top in CONTRACT_LAZY_PACKAGES and imported.lazy:
        return []
    return [f"{where} (rule: contract imports the standard library, {', '.join(sorted(CONTRACT_PACKAGES))}, and "
            f"{', '.join(sorted(CONTRACT_LAZY_PACKAGES))} only inside a function)"]


def floor_edges(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """(floor, imported floor) -> the first 'file:line' that imports across them."""
    edges: dict[tuple[str, str], str] = {}
    for path in source_files(root):
        relative = path.relative_to(root).as_posix()
        floor = floor_of_file(relative)
        for imported in imports(path) if floor else []:
            target = floor_of_module(imported.module)
            if target is not None and target != floor:
                edges.setdefault((floor, target), f"{relative}:{imported.line}")
    return edges


def circle(edges: dict[tuple[str, str], str]) -> list[str]:
    """One circle of the graph as its floors in order (first repeated at the end), or [] where there is none."""
    graph: dict[str, list[str]] = {}
    for source, target in edges:
        graph.setdefault(source, []).append(target)
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        for target in graph.get(node, []):
            found = walk(target, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = walk(start, [])
        if found:
            return found
    return []


def test_every_module_keeps_to_its_floor():
    found = [breach for path in source_files() for breach in breaches(path, path.relative_to(ROOT).as_posix())]
    assert found == [], "\n".join(found)


def test_every_module_is_on_a_floor_or_a_command():
    paths = [path.relative_to(ROOT).as_posix() for path in source_files()]
    assert len(paths) > 80
    assert [path for path in paths if floor_of_file(path) is None and path not in ENTRY_MODULES] == []


def test_the_floors_import_one_way():
    edges = floor_edges()
    assert ("driver", "cluster") in edges and ("analysis", "contract") in edges  # the graph is read at all
    found = circle(edges)
    assert found == [], "a circle of floors: " + " -> ".join(
        f"{source} ({edges[source, target]})" for source, target in zip(found, found[1:])) + f" -> {found[-1]}"


def test_the_rules_themselves_have_no_circle():
    assert circle({(floor, target): "" for floor, allowed in FLOORS.items() for target in allowed}) == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from harness.driver import launch\n    import harness.rank.worker\n")
    assert imports(module) == [Import(1, "os", False), Import(4, "harness.driver.launch", True),
                               Import(5, "harness.rank.worker", True)]


def test_a_breach_names_the_file_the_line_and_the_rule(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import json\n\n\ndef f():\n    from harness import arms\n    import torch\n")
    assert breaches(module, "harness/contract/m.py") == [
        "harness/contract/m.py:5: imports harness.arms (rule: contract imports no other floor)"]
    module.write_text("from harness.offload import PLANNING_STEP\nimport hydra\n")
    assert breaches(module, "harness/arms/m.py") == [
        "harness/arms/m.py:1: imports harness.offload.PLANNING_STEP at module level (rule: arms imports offload "
        "only inside a function)"]
    assert breaches(module, "harness/contract/m.py") == [
        "harness/contract/m.py:1: imports harness.offload.PLANNING_STEP (rule: contract imports no other floor)",
        "harness/contract/m.py:2: imports hydra (rule: contract imports the standard library, numpy, yaml, and torch "
        "only inside a function)"]


def test_a_circle_is_found_and_named():
    assert circle({("a", "b"): "", ("b", "c"): "", ("c", "a"): "", ("c", "d"): ""}) == ["a", "b", "c", "a"]
    assert circle({("a", "b"): "", ("a", "c"): "", ("b", "c"): ""}) == []
