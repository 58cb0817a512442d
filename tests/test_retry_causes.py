"""Why the allocator retried, as the report reads it: memory_trace.json's retries (harness/contract/retry_trace.py)
through the reader into each point's row, and the retry_causes table's shares per design point."""
import json
import shutil

import pytest

from analysis.columns import TRACED_READING_COLUMNS, TRACED_RETRIES
from analysis.load import load_sweep
from analysis.retry_causes import has_retry_traces, retry_cause_table
from conftest import REPO_ROOT
from harness.contract.retry_trace import RETRY_READINGS, NotARetryTrace, retry_trace
from harness.rank.memory_trace import retry_reading

FIXTURE = REPO_ROOT / "analysis" / "fixtures" / "sweep"


def trace(count: int, readings: list[str], sizes: list[int] | None = None) -> dict:
    """A memory_trace.json summary with `count` retries, the listed ones read as `readings`."""
    sizes = sizes or [2**20 * (position + 1) for position in range(len(readings))]
    return {"retry_count": count, "retries": [{"reading": reading, "missed": {"bytes": size, "stream": 0}}
                                              for reading, size in zip(readings, sizes)]}


def test_a_trace_counts_each_reading_of_the_retries_it_lists():
    read = retry_trace(trace(25, ["headroom"] * 12 + ["deferred"] * 6 + ["other_stream"] * 2, sizes=[5] * 19 + [9]))
    assert read.retries == 25 and read.listed == 20 and read.largest_miss_bytes == 9
    assert dict(read.readings) == {"deferred": 6, "fragmentation": 0, "other_stream": 2, "headroom": 12}


def test_the_largest_miss_carries_the_largest_free_block_its_stream_had_then():
    listed = trace(3, ["fragmentation"] * 3, sizes=[4, 9, 6])
    for retry, free in zip(listed["retries"], (3, 7, 5)):
        retry["before"] = {"largest_free_block_bytes": free}
    read = retry_trace(listed)
    assert (read.largest_miss_bytes, read.free_at_largest_miss_bytes) == (9, 7)
    assert retry_trace(trace(1, ["headroom"])).free_at_largest_miss_bytes is None  # a trace from before the record
    listed["retries"][0]["before"]["largest_free_block_bytes"] = -1
    with pytest.raises(NotARetryTrace):
        retry_trace(listed)


@pytest.mark.parametrize("bad", [
    [], {"retries": []}, {"retry_count": 1, "retries": [{}, {}]}, {"retry_count": -1, "retries": []},
    trace(1, ["unlucky"]), {"retry_count": 1, "retries": [{"reading": "headroom", "missed": {"bytes": "big"}}]},
], ids=["list", "no-count", "more-listed-than-counted", "negative", "unknown-reading", "bytes-not-a-number"])
def test_a_malformed_trace_is_refused(bad):
    with pytest.raises(NotARetryTrace):
        retry_trace(bad)


def test_the_rank_reads_retries_in_the_contracts_words():
    pool = {"total": {"deferred_bytes": 0, "cached_free_bytes": 0}, "streams": []}
    assert retry_reading({"bytes": 1, "stream": 0}, pool) == "headroom" == RETRY_READINGS[-1]
    pool["total"]["deferred_bytes"] = 1
    assert retry_reading({"bytes": 1, "stream": 0}, pool) == "deferred" == RETRY_READINGS[0]


@pytest.fixture
def traced_sweep(tmp_path):
    """The fixture sweep with two runs of its first design point traced, and a third run's trace malformed."""
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep_dir)
    run_dirs = sorted(path.parent for path in sweep_dir.glob("*/summary.json"))
    (run_dirs[0] / "memory_trace.json").write_text(json.dumps(trace(3, ["headroom", "headroom", "deferred"])))
    fragmented = trace(1, ["fragmentation"], sizes=[3 * 10**9])
    fragmented["retries"][0]["before"] = {"largest_free_block_bytes": 2 * 10**9}
    (run_dirs[1] / "memory_trace.json").write_text(json.dumps(fragmented))
    (run_dirs[2] / "memory_trace.json").write_text("{not json")
    return sweep_dir, run_dirs


def test_the_reader_carries_each_traced_step_into_its_points_row_and_names_a_bad_trace(traced_sweep):
    sweep_dir, run_dirs = traced_sweep
    sweep = load_sweep(sweep_dir)
    assert len(sweep.points) == len(run_dirs)  # a bad trace costs its columns only
    [warning] = [problem.line() for problem in sweep.problems]
    assert str(run_dirs[2] / "memory_trace.json") in warning and "retry causes left empty" in warning
    traced = sweep.points[sweep.points[TRACED_RETRIES].notna()].set_index("run_dir")
    assert traced.loc[run_dirs[0].name, TRACED_RETRIES] == 3
    assert traced.loc[run_dirs[0].name, TRACED_READING_COLUMNS["headroom"]] == 2
    assert traced.loc[run_dirs[1].name, TRACED_READING_COLUMNS["fragmentation"]] == 1
    assert len(traced) == 2


def test_the_table_pools_a_points_traced_runs_into_shares_of_the_listed_retries(traced_sweep):
    sweep_dir, run_dirs = traced_sweep
    points = load_sweep(sweep_dir).points
    assert has_retry_traces(points)
    table = retry_cause_table(points)
    traced_points = points[points[TRACED_RETRIES].notna()]
    assert table.values["traced_runs"].sum() == 2 and table.values["retries"].sum() == 4
    pooled = table.values[["deferred_retries", "fragmentation_retries", "other_stream_retries",
                           "headroom_retries"]].sum()
    assert list(pooled) == [1, 1, 0, 2]
    for _, row in table.values.iterrows():  # each point's shares add up over the listed retries
        shares = [row[f"{reading}_share"] for reading in RETRY_READINGS]
        assert sum(shares) == pytest.approx(1.0)
    assert len(table.display) == len(table.values) <= len(traced_points)
    assert "3" in table.display[("", "largest miss (GB)")].tolist()
    # beside the 3 GB that missed, the 2 GB block its stream had free: no block large enough (fragmentation)
    assert ["2"] == [cell for cell in table.display[("", "largest free block then (GB)")] if cell != "-"]


def test_a_sweep_without_a_traced_step_gets_no_retry_causes():
    assert not has_retry_traces(load_sweep(FIXTURE).points)
