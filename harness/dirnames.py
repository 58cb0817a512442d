"""Point folder names that always fit: the overrides, cut to fit the filesystem's 255-byte name limit plus a
short hash of the full list where they are longer (the full list stays in config.yaml and index.jsonl).

conf/hydra/default.yaml names folders `${harness_dirname:${hydra.job.override_dirname}}`; `register()` must run
before Hydra resolves them (harness.run calls it at import, so do submitit's job processes).
"""
from __future__ import annotations

import hashlib

RESOLVER = "harness_dirname"
# What the overrides may take of a name; the rest is for the prefix Hydra adds ("<job num>_" in a sweep,
# "HH-MM-SS_" in a single run) under the 255 bytes most filesystems allow.
MAX_BYTES = 200
HASH_CHARS = 10


def bounded_dirname(override_dirname: str, max_bytes: int = MAX_BYTES) -> str:
    """The overrides as they are when they fit, else as many whole overrides as fit, then `~` and a hash
    of the whole list (so two long lists that share their start still get two folders)."""
    name = str(override_dirname)
    encoded = name.encode()
    if len(encoded) <= max_bytes:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:HASH_CHARS]
    head = encoded[:max_bytes - HASH_CHARS - 1].decode(errors="ignore")  # never half a UTF-8 character
    if "," in head:  # keep whole overrides
        head = head.rsplit(",", 1)[0]
    return f"{head}~{digest}"


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, bounded_dirname)
