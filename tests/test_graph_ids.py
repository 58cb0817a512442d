"""DeepCompile's graph ids made stable across processes (harness/rank/graph_ids.py, `sweep.stable_graph_ids`): a
Dynamo graph is named by its compile id, the same in every process of the same program, and anything else keeps
its address. On by default since tests/test_offload_gpu.py -k stable passed on an H100 (2026-12-06, from 5fab67f)."""
from __future__ import annotations

import builtins
import json
import subprocess
import sys

import pytest
import torch

from harness.rank import graph_ids

PROGRAM = """
import json
import torch
from harness.rank.graph_ids import stable_graph_id
graphs = []
def backend(gm, inputs):
    graphs.append(gm.graph)
    return gm.forward
@torch.compile(backend=backend)
def f(x):
    return torch.sin(x) + 1
f(torch.ones(3)); f(torch.ones(2, 2))  # a second shape: a recompile of the same frame
print(json.dumps([stable_graph_id(graph) for graph in graphs]))
"""


def ids_of_one_process() -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # two Python processes, each compiling
def test_a_dynamo_graph_gets_the_same_distinct_id_in_every_process():
    first, second = ids_of_one_process(), ids_of_one_process()
    assert first == second  # stable: the same ids in both processes
    assert len(set(first)) == 2 and all(value >= graph_ids.STABLE_BASE for value in first)  # one per compile


def test_a_graph_not_made_by_dynamo_and_anything_else_keep_their_address():
    traced = torch.fx.symbolic_trace(torch.nn.ReLU())
    assert graph_ids.stable_graph_id(traced.graph) is None
    assert graph_ids.graph_or_address_id(traced.graph) == builtins.id(traced.graph)
    value = object()
    assert graph_ids.graph_or_address_id(value) == builtins.id(value)


def test_a_frame_recompiled_past_its_room_falls_back_to_the_address():
    class CompileId:
        frame_id, frame_compile_id = 3, graph_ids.COMPILES_PER_FRAME

    traced = torch.fx.symbolic_trace(torch.nn.ReLU())
    traced.meta["dynamo_compile_id"] = CompileId()
    assert graph_ids.stable_graph_id(traced.graph) is None
    CompileId.frame_compile_id = 1
    assert graph_ids.stable_graph_id(traced.graph) == graph_ids.STABLE_BASE + 3 * graph_ids.COMPILES_PER_FRAME + 1


def test_install_names_deepcompiles_graphs_only_where_its_backend_names_them_by_address(monkeypatch):
    from deepspeed.compile import backend

    monkeypatch.setattr(backend, "id", builtins.id, raising=False)  # undone after the test
    assert graph_ids.install() is True and backend.id is graph_ids.graph_or_address_id
    monkeypatch.setattr(backend, "id", builtins.id)
    monkeypatch.setattr(backend, "make_backend", lambda *args: None)  # a DeepSpeed that names graphs otherwise
    assert graph_ids.install() is False and backend.id is builtins.id
