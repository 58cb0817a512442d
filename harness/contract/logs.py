"""The harness's one logger: `logging`, configured here alone. Every module logs to `logging.getLogger(__name__)`
under `harness`; a rank's lines carry its rank (`[rank 1] ...`), the driver's none, and `launcher.log_level`
sets the level. Warnings and errors go to stderr, the rest to stdout, as the lines always have. Rank 0's
progress line (PROGRESS) is written bare whatever the level: the driver echoes the lines that start with 'step '."""
from __future__ import annotations

import logging
import sys

from harness.contract.schema import LauncherConfig, choices

LEVELS = choices(LauncherConfig, "log_level")
DEFAULT_LEVEL = "INFO"
ROOT = "harness"
PROGRESS = "harness.progress"


class _StandardStream(logging.StreamHandler):
    """A handler on sys.stdout or sys.stderr as they are when a line is written (pytest and Hydra swap them)."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    @property
    def stream(self):
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler's constructor sets it; the stream is always looked up
        pass


def _handlers(prefix: str) -> list[logging.Handler]:
    out, err = _StandardStream("stdout"), _StandardStream("stderr")
    out.addFilter(lambda record: record.levelno < logging.WARNING)
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    return [out, err]


def _attach(name: str, handlers: list[logging.Handler], level: str) -> None:
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    for handler in handlers:
        logger.addHandler(handler)


def setup(level: str = DEFAULT_LEVEL, rank: int | None = None) -> None:
    """Configure the harness's logger for this process: `rank` None for the driver."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    _attach(ROOT, _handlers("" if rank is None else f"[rank {rank}] "), level)
    _attach(PROGRESS, _handlers(""), "INFO")


setup()  # the default until the driver or a rank knows its config
