"""GPU test of the step diagnostics on a tiny eager ZeRO-3 run (torch Adam: no DeepSpeed op build), ~1 min."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_profile_and_memory_trace_of_one_step_on_cuda(tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "harness.run", "model=tiny", "arm=zero3", "train.steps=3", "train.torch_adam=true",
               "logger=none", "debug.profile_step=1", "debug.memory_trace_step=2", f"hydra.run.dir={run}"]
    proc = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "HARNESS_ROOT": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=600)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok", proc.stdout[-3000:] + proc.stderr[-3000:]

    trace = json.loads((run / "memory_trace.json").read_text())
    assert trace["trace_entries"] > 0 and trace["streams"]
    assert trace["reserved_bytes"] >= trace["allocated_bytes"] > 0
    assert (run / "memory_snapshot.pickle").stat().st_size > 0

    events = json.loads((run / "torch_trace.json").read_text())["traceEvents"]
    assert any(event.get("cat") == "kernel" for event in events)  # device kernels were recorded
    assert "CUDA" in (run / "torch_ops.txt").read_text()
