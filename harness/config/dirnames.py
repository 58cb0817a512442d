"""Point folder names that are always one folder and always fit: the overrides with separators and `..` replaced,
cut to fit the filesystem's 255-byte name limit plus a short hash of the full list where they are longer (the
full list stays in .hydra/overrides.yaml and index.jsonl).

conf/hydra/default.yaml names folders `${harness_dirname:}`, which reads Hydra's `hydra.job.override_dirname` as
written: Hydra would resolve a `${...}` inside an override's value there (`${oc.env:HOME}` would put `/root` in the
name, a missing variable end the sweep). `register()` must run before Hydra resolves the folder names (harness.run
calls it at import, so do submitit's job processes).
"""
from __future__ import annotations

import hashlib
import re

RESOLVER = "harness_dirname"
# What the overrides may take of a name; the rest is for the prefix Hydra adds ("<job num>_" in a sweep,
# "HH-MM-SS_" in a single run) under the 255 bytes most filesystems allow.
MAX_BYTES = 200
HASH_CHARS = 10
# A value may hold what would make the name a path or unreadable: path separators, a parent step (`..`), NUL and
# other control characters, and `$`: Hydra stores the folder as hydra.runtime.output_dir, where a quoted value's
# `${...}` would be resolved after all (a missing variable ended the driver in a traceback). Each becomes `%XX` (its
# code, as in a URL); `%` itself too, so no two lists share a name.
_UNSAFE = re.compile(r"[%$/\\\x00-\x1f\x7f]|\.(?=\.)")


def safe_name(text: str) -> str:
    """`text` as one folder name: no separator, no `..`, no control character."""
    return _UNSAFE.sub(lambda match: f"%{ord(match.group()):02X}", text)


def bounded_dirname(override_dirname: str, max_bytes: int = MAX_BYTES) -> str:
    """The overrides, made safe (safe_name), as they are when they fit, else as many whole overrides as fit, then
    `~` and a hash of the whole list (so two long lists that share their start still get two folders)."""
    name = safe_name(str(override_dirname))
    encoded = name.encode()
    if len(encoded) <= max_bytes:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:HASH_CHARS]
    head = encoded[:max_bytes - HASH_CHARS - 1].decode(errors="ignore")  # never half a UTF-8 character
    if "," in head:  # keep whole overrides
        head = head.rsplit(",", 1)[0]
    return f"{head}~{digest}"


def point_dirname(*, _root_) -> str:
    """The resolver: this point's folder name from its overrides as written (interpolations left as text)."""
    from omegaconf import OmegaConf

    job = OmegaConf.to_container(_root_.hydra.job, resolve=False)
    return bounded_dirname(job.get("override_dirname") or "")


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, point_dirname)
