"""Run files opened so that a results folder cannot be turned against its reader (a report, bench, load_sweep,
the planner CLI, the driver reading what its ranks wrote):
- a file is opened only if, its links resolved, it is a regular file inside the folder it belongs to (the sweep
  dir), and no larger than MAX_FILE_BYTES; a device or a FIFO is refused from its stat, never opened to block;
- it must be UTF-8 text; a file named *.gz is gzip-compressed text (a committed campaign's profile), inflated no
  further than the same size limit, so a kilobyte that would inflate to gigabytes is refused, never held;
- JSON and YAML nest at most MAX_DEPTH deep (deeper would overflow the reader's stack), and YAML has no aliases
  (an alias bomb of a kilobyte expands to gigabytes in whoever walks the data).
Each refusal is one RefusedFile naming the file; a missing file stays a FileNotFoundError (what it means is the
caller's: a point left out, a column left empty).
"""
from __future__ import annotations

import json
import os
import zlib
import stat
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

# The largest run file read: steps.jsonl of a long point is a few MB; a profile of a big model some tens of MB.
MAX_FILE_BYTES = 256 * 1024 * 1024
# Deeper than any run file the harness writes (a config nests 4 levels, plan.json 4), far below the stack's limit.
MAX_DEPTH = 64


class RefusedFile(ValueError):
    """A run file that breaks a rule of this module: args (file, message)."""

    @property
    def file(self) -> str:
        return str(self.args[0])

    @property
    def message(self) -> str:
        return str(self.args[1])


def read_text(path: str | Path, root: str | Path | None = None, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file that stays inside `root` (default: the folder the path names it in) once its
    links are resolved, inflated where it is named *.gz. FileNotFoundError where it is missing; RefusedFile for any
    other rule it breaks."""
    path = Path(path)
    try:
        resolved = path.resolve()  # a missing target raises below, from os.stat
    except RuntimeError:  # a loop of links
        raise RefusedFile(str(path), "a loop of links; not read") from None
    folder = Path(root if root is not None else path.parent).resolve()
    if not resolved.is_relative_to(folder):
        raise RefusedFile(str(path), f"leads out of {folder}; not read")
    info = os.stat(resolved)
    if not stat.S_ISREG(info.st_mode):
        raise RefusedFile(str(path), "not a regular file (a device, a FIFO or a folder); not read")
    if info.st_size > max_bytes:
        raise RefusedFile(str(path), f"larger than {max_bytes} bytes; not read")
    # O_NONBLOCK: a file swapped for a FIFO since the stat cannot make the open wait for a writer.
    descriptor = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise RefusedFile(str(path), "not a regular file; not read")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RefusedFile(str(path), f"larger than {max_bytes} bytes; not read")
    if path.name.endswith(".gz"):
        data = _inflate(data, max_bytes, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RefusedFile(str(path), "not UTF-8 text; not read") from None


def _inflate(data: bytes, max_bytes: int, path: Path) -> bytes:
    """A gzip file's bytes inflated, at most max_bytes of them; RefusedFile where it inflates further or is no
    single whole gzip stream."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # 16+: the gzip header and trailer, checked
    try:
        text = inflater.decompress(data, max_bytes + 1)
    except zlib.error as error:
        raise RefusedFile(str(path), f"not gzip ({error}); not read") from None
    if len(text) > max_bytes:
        raise RefusedFile(str(path), f"inflates past {max_bytes} bytes; not read")
    if not inflater.eof or inflater.unused_data:
        raise RefusedFile(str(path), "not one whole gzip stream; not read")
    return text


def parse_json(text: str, file: str | Path) -> Any:
    """JSON text as data; ValueError where it is not JSON (a number of thousands of digits included), RefusedFile
    where it nests deeper than MAX_DEPTH."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise RefusedFile(str(file), f"nested deeper than {MAX_DEPTH} levels; not read") from None
    _check_depth(data, file)
    return data


def parse_yaml(text: str, file: str | Path) -> Any:
    """YAML text as data, read with the safe loader; yaml.YAMLError (or ValueError) where it is not YAML,
    RefusedFile where it holds an alias or nests deeper than MAX_DEPTH. Its events are read first, one by one, so
    neither an alias nor the nesting is ever built."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise RefusedFile(str(file), "holds a YAML alias (run files have none); not read")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise RefusedFile(str(file), f"nested deeper than {MAX_DEPTH} levels; not read")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return yaml.safe_load(text)


def read_json(path: str | Path, root: str | Path | None = None, max_bytes: int = MAX_FILE_BYTES) -> Any:
    return parse_json(read_text(path, root, max_bytes), path)


def read_yaml(path: str | Path, root: str | Path | None = None, max_bytes: int = MAX_FILE_BYTES) -> Any:
    return parse_yaml(read_text(path, root, max_bytes), path)


Facts = TypeVar("Facts")


def read_optional_json(path: str | Path, root: str | Path | None, facts: Callable[[Any], Facts]) -> Facts | None:
    """What `facts` makes of an optional run file's JSON (a debug recorder's), None where the file is missing;
    RefusedFile, OSError or ValueError (not JSON, or whatever `facts` raises) for one that is not readable."""
    try:
        data = read_json(path, root)
    except FileNotFoundError:
        return None
    return facts(data)


def _check_depth(data: Any, file: str | Path) -> None:
    """Walk the data without recursion: deeper than MAX_DEPTH is refused."""
    pending = [(data, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise RefusedFile(str(file), f"nested deeper than {MAX_DEPTH} levels; not read")
            pending.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
