import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where CUDA is missing (they run there with `pytest -m gpu`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_file_mode() -> int:
    """The mode every run file gets under this process's umask (0644 under the usual 022)."""
    from harness.runfiles import RUN_FILE_MODE

    umask = os.umask(0)
    os.umask(umask)
    return RUN_FILE_MODE & ~umask
