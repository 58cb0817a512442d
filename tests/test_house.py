"""House rules a reader can check file by file: no module of harness/ or analysis/ over 400 lines, and every relative
link of every README.md in the repo leads to a file or folder that exists."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400

FENCED_CODE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
NOT_A_PATH = re.compile(r"^([a-z][a-z0-9+.-]*:|#)", re.I)  # a URL (https:, mailto:) or an anchor of the page itself


def module_lengths(root: Path = ROOT) -> dict[str, int]:
    """Lines of every .py under harness/ and analysis/, by path from the repo root."""
    return {path.relative_to(root).as_posix(): len(path.read_text().splitlines())
            for source in ("harness", "analysis") for path in sorted((root / source).rglob("*.py"))}


def too_long(lengths: dict[str, int]) -> list[str]:
    return [f"{path}: {lines} lines (at most {MAX_LINES})" for path, lines in lengths.items()
            if lines > MAX_LINES]


def readmes(root: Path = ROOT) -> list[Path]:
    """Every README.md of the repo, outside hidden folders (.git, a virtual environment)."""
    return sorted(path for path in root.rglob("README.md")
                  if not any(part.startswith(".") for part in path.relative_to(root).parts))


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link in Markdown text that names a path: inline links and images, reference
    definitions; links shown as code are no links."""
    prose = INLINE_CODE.sub(lambda code: " " * len(code.group()),
                            FENCED_CODE.sub(lambda block: "\n" * block.group().count("\n"), text))
    found = [(prose.count("\n", 0, match.start(1)) + 1, match.group(1))
             for pattern in (INLINE_LINK, REFERENCE_LINK) for match in pattern.finditer(prose)]
    return sorted((line, target) for line, target in found if not NOT_A_PATH.match(target))


def broken_links(readme: Path, root: Path = ROOT) -> list[str]:
    """'README:line: target' for each relative link whose path (its anchor left off) does not exist."""
    broken = []
    for line, target in relative_links(readme.read_text()):
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        base = root if path.startswith("/") else readme.parent
        if not (base / path.lstrip("/")).exists():
            broken.append(f"{readme.relative_to(root)}:{line}: {target} does not exist")
    return broken


def test_no_module_is_over_400_lines():
    lengths = module_lengths()
    assert len(lengths) > 80 and "analysis/tables.py" in lengths
    assert too_long(lengths) == []


def test_a_long_module_is_named_with_its_length():
    assert too_long({"analysis/short.py": 400, "analysis/long.py": 401}) == [
        "analysis/long.py: 401 lines (at most 400)"]


def test_every_relative_link_of_every_readme_resolves():
    found = readmes()
    assert ROOT / "README.md" in found
    assert [broken for readme in found for broken in broken_links(readme)] == []


def test_a_broken_link_is_named_by_its_readme_and_line(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# there\n")
    readme = tmp_path / "docs" / "README.md"
    readme.write_text("[ok](there.md#there) [up](../docs/) [web](https://example.org/x) [self](#top)\n"
                      "`[code](nowhere.md)`\n\n```\n[block](nowhere.md)\n```\n"
                      "![figure](gone.png) [two\nlines](missing/file.md)\n\n[ref]: gone/also.md\n")
    assert broken_links(readme, tmp_path) == ["docs/README.md:7: gone.png does not exist",
                                              "docs/README.md:8: missing/file.md does not exist",
                                              "docs/README.md:10: gone/also.md does not exist"]
