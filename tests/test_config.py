"""Every config group option and experiment composes; presets have the parameter counts of their models."""
import shlex
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import BAD_VALUES
from harness import arms
from harness.contract.errors import ConfigError
from harness.contract.schema.config import group_of
from harness.contract.schema.groups import ModelShape
from harness.rank.models import count_parameters, flops_per_token
from harness.config.compose import sweep_points
from harness.driver.validate import check_group_choices, validate

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF = REPO_ROOT / "conf"


def options(group_dir: Path) -> list[str]:
    return sorted(p.stem for p in group_dir.glob("*.yaml"))


def compose_config(overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


@pytest.mark.parametrize("arm", options(CONF / "arm"))
def test_every_arm_composes_and_is_known(arm):
    cfg = compose_config([f"arm={arm}"])
    assert cfg.arm.name == arm
    built = arms.from_config(cfg.arm)
    assert built.name == arm and type(built) is arms.registered()[arm]


@pytest.mark.parametrize("model", options(CONF / "model"))
def test_every_model_composes_and_builds_a_config(model):
    cfg = OmegaConf.to_container(compose_config([f"model={model}"]), resolve=True)
    assert cfg["model"]["name"] == model
    validate(cfg, gpu_count=0)


@pytest.mark.parametrize("experiment", options(REPO_ROOT / "experiments"))
def test_every_experiment_composes_with_its_sweep(experiment):
    cfg = compose_config([f"experiments={experiment}"], hydra=True)
    assert cfg.sweep.name == experiment
    for key, values in (cfg.hydra.sweeper.params or {}).items():
        for value in str(values).split(","):
            compose_config([f"experiments={experiment}", f"{key}={value}"])


def test_retry_split_rows_set_the_allocator_and_the_default_row_is_the_default():
    """Each retry_split row changes only the ranks' PYTORCH_CUDA_ALLOC_CONF, and its `default` row is conf's."""
    default = compose_config([]).env.pytorch_cuda_alloc_conf
    confs = {}
    for row in options(REPO_ROOT / "experiments" / "retry_split_rows"):
        cfg = compose_config(["experiments=retry_split", f"+experiments/retry_split_rows={row}"])
        validate(OmegaConf.to_container(cfg, resolve=True), gpu_count=1)
        assert cfg.arm.name == "offload" and cfg.train.sub_group_size == 100_000_000
        confs[row] = cfg.env.pytorch_cuda_alloc_conf
    assert confs.pop("default") == default
    assert len(set(confs.values())) == len(confs) and default not in confs.values()


@pytest.mark.parametrize("row", options(REPO_ROOT / "experiments" / "pr8186_rows"))
def test_pr8186_rows_select_their_arm(row):
    cfg = compose_config(["experiments=pr8186_table", f"+experiments/pr8186_rows={row}"])
    raw = yaml.safe_load((REPO_ROOT / "experiments" / "pr8186_rows" / f"{row}.yaml").read_text())
    wanted_arm = raw["defaults"][0]["override /arm"]
    assert cfg.arm.name == wanted_arm
    for key, value in (raw.get("arm") or {}).items():
        assert cfg.arm[key] == value
    assert cfg.model.name == "qwen3_14b" and cfg.train.micro_batch == 4


def test_accumulation_rows_keep_one_global_batch():
    for row in options(REPO_ROOT / "experiments" / "accumulation_rows"):
        train = compose_config(["experiments=accumulation", f"+experiments/accumulation_rows={row}"]).train
        assert row == f"mb{train.micro_batch}" and train.micro_batch * train.grad_accum == 16
        assert train.measure_steps >= 20


# The campaign's cut (issue: the rows that answer the micro-batch question): each row is (arm, micro-batch);
# deepcompile's reference at micro-batch 2, the largest it fits (at 4 it ran out, results/accumulation/).
ACCUMULATION_CUT = {"ours_mb1": ("offload", 1), "ds_mb1": ("ds_offload", 1), "ours_mb4": ("offload", 4),
                    "ds_mb4": ("ds_offload", 4), "dc_mb2": ("deepcompile", 2)}
OUT_OF_THE_CUT = {"dc_mb4": ("deepcompile", 4)}  # its run that ran out is committed; the row still composes


def test_accumulation_campaign_sweeps_its_cut_interleaved():
    swept = compose_config(["experiments=accumulation"], hydra=True).hydra.sweeper.params
    assert list(swept) == ["train.repeat", "+experiments/accumulation_cut"]  # repeats vary slowest: interleaved
    assert str(swept["train.repeat"]).split(",") == ["0", "1", "2"]
    assert str(swept["+experiments/accumulation_cut"]).split(",") == list(ACCUMULATION_CUT)
    for row, (arm, micro_batch) in {**ACCUMULATION_CUT, **OUT_OF_THE_CUT}.items():
        cfg = compose_config(["experiments=accumulation", f"+experiments/accumulation_cut={row}"])
        assert (cfg.arm.name, cfg.train.micro_batch, cfg.train.grad_accum) == (arm, micro_batch, 16 // micro_batch)
        assert cfg.arm.schedule == "z3_only"


def test_accumulation_full_grid_row_leaves_arm_and_micro_batch_to_the_command_line():
    cfg = compose_config(["experiments=accumulation", "+experiments/accumulation_cut=grid", "arm=ds_offload",
                          "+experiments/accumulation_rows=mb2"])
    assert (cfg.arm.name, cfg.train.micro_batch, cfg.train.grad_accum) == ("ds_offload", 2, 8)


# Published parameter counts of the shapes (Qwen3 model cards, Llama 3 paper).
@pytest.mark.parametrize("model,expected", [
    ("qwen3_14b", 14.77e9), ("qwen3_8b", 8.19e9), ("qwen3_4b", 4.02e9), ("qwen3_1.7b", 1.72e9),
    ("qwen3_0.6b", 0.596e9), ("llama3_8b", 8.03e9), ("llama3_70b", 70.55e9), ("probe_534m", 533.8e6),
])
def test_preset_parameter_counts(model, expected):
    preset = yaml.safe_load((CONF / "model" / f"{model}.yaml").read_text())
    assert count_parameters(preset) == pytest.approx(expected, rel=0.005)


def test_tiny_is_a_tiny_qwen3():
    preset = yaml.safe_load((CONF / "model" / "tiny.yaml").read_text())
    assert preset["family"] == "qwen3"
    assert count_parameters(preset) < 1e6


def test_flops_per_token_counts_matmuls_and_attention():
    preset = yaml.safe_load((CONF / "model" / "probe_534m.yaml").read_text())
    n = count_parameters(preset)
    cfg = preset["config"]
    untied_embedding = cfg["vocab_size"] * cfg["hidden_size"]
    attention = 12 * cfg["num_hidden_layers"] * 1024 * cfg["num_attention_heads"] * cfg["head_dim"]
    assert flops_per_token(group_of(ModelShape, cfg), n, 1024) == 6 * (n - untied_embedding) + attention


def test_unknown_group_option_is_one_line_naming_the_group():
    with pytest.raises(ConfigError) as err:
        check_group_choices(["arm=zero3,nonsense"], REPO_ROOT)
    assert err.value.key == "arm" and "nonsense" in str(err.value)
    check_group_choices(["model=qwen3_14b", "experiments=probe", "train.steps=3"], REPO_ROOT)


@pytest.mark.parametrize("overrides,key", [
    *BAD_VALUES,
    (["offload.budget_gb=4", "offload.budget_fraction=0.5"], "offload.budget_gb"),
    (["arm=ds_offload", "arm.variant=fast"], "arm.variant"),
    (["train.seq_len=4096"], "train.seq_len"),
    (["debug.fault=segfault"], "debug.fault"),
    (["train.measure_steps=3", "debug.memory_trace_step=6"], "debug.memory_trace_step"),  # zero3: steps 0-5
    (["train.steps=6"], "train.steps"),  # beside the default train.measure_steps
    (["train.measure_steps=null"], "train.steps"),  # neither
    (["train.warmup_steps=-1"], "train.warmup_steps"),
    (["debug.memory_trace_step=-1"], "debug.memory_trace_step"),
    (["debug.memory_trace_step=true"], "debug.memory_trace_step"),
    (["train.measure_steps=3", "debug.memory_trace_step=4", "debug.memory_trace_steps=3"],
     "debug.memory_trace_steps"),  # zero3: steps 0-5, the window 4-6
    (["debug.memory_trace_steps=0"], "debug.memory_trace_steps"),
    (["debug.copy_delay_us=-1"], "debug.copy_delay_us"),
    (["debug.copy_delay_us=2.5"], "debug.copy_delay_us"),
    (["debug.copy_delay_us=true"], "debug.copy_delay_us"),
    (["debug.profile_step=1.5"], "debug.profile_step"),
    (["env.reserved_cap_gb=0"], "env.reserved_cap_gb"),
    (["env.reserved_cap_gb=lots"], "env.reserved_cap_gb"),
    (["env.reserved_cap_gb=true"], "env.reserved_cap_gb"),
    (["train.reduce_bucket_size=0"], "train.reduce_bucket_size"),
    (["train.reduce_bucket_size=1.5"], "train.reduce_bucket_size"),
    (["train.reduce_bucket_size=big"], "train.reduce_bucket_size"),
    (["env.device_memory_gb=0"], "env.device_memory_gb"),
    (["env.device_memory_gb=nan"], "env.device_memory_gb"),
    (["env.device_memory_gb=12", "env.reserved_cap_gb=13"], "env.reserved_cap_gb"),
    (["arm=offload", "offload.evict_from=never"], "offload.evict_from"),
])
def test_bad_values_name_their_key(overrides, key):
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu_count=0)
    assert err.value.key == key


def test_a_reserved_cap_is_a_positive_number_of_gb():
    for value in ("12", "0.5"):
        validate(OmegaConf.to_container(compose_config([f"env.reserved_cap_gb={value}"]), resolve=True), gpu_count=0)


def test_reduce_bucket_size_reaches_the_zero_config_only_when_set():
    default = validate(OmegaConf.to_container(compose_config([]), resolve=True), gpu_count=0)
    ds_config = default.arm.deepspeed_config
    assert "reduce_bucket_size" not in ds_config(default, cuda=False)["zero_optimization"]
    cfg = OmegaConf.to_container(compose_config(["train.reduce_bucket_size=5e7"]), resolve=True)
    assert ds_config(validate(cfg, gpu_count=0), cuda=False)["zero_optimization"]["reduce_bucket_size"] == 50_000_000


def test_more_ranks_than_gpus_is_refused():
    cfg = OmegaConf.to_container(compose_config(["launcher.nproc_per_node=4"]), resolve=True)
    validate(cfg, gpu_count=0)  # CPU ranks are processes, not devices
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu_count=2)
    assert err.value.key == "launcher.nproc_per_node"


@pytest.mark.parametrize("row", options(REPO_ROOT / "experiments" / "compose_rows"))
def test_compose_rows_select_their_arm_and_composition(row):
    cfg = compose_config(["experiments=compose_limit", f"+experiments/compose_rows={row}"])
    raw = yaml.safe_load((REPO_ROOT / "experiments" / "compose_rows" / f"{row}.yaml").read_text())
    assert cfg.arm.name == raw["defaults"][0]["override /arm"]
    assert cfg.offload.compose == (raw.get("offload") or {}).get("compose", "none")
    assert cfg.offload.budget_gb == 11 and cfg.env.device_memory_gb == 12
    validate(OmegaConf.to_container(cfg, resolve=True), gpu_count=0)


def capacity_commands() -> list[list[str]]:
    """The overrides of each `python -m harness.run -m ...` line in experiments/capacity.yaml's header."""
    lines = (REPO_ROOT / "experiments" / "capacity.yaml").read_text().splitlines()
    prefix = "#   python -m harness.run -m "
    return [shlex.split(line.removeprefix(prefix).split("#")[0]) for line in lines if line.startswith(prefix)]


def test_capacity_header_commands_add_ours_at_deepspeeds_auto_budget_and_the_repeats():
    """The header's commands expand to the points the campaign's README and the report expect: every arm's repeats
    at 1024, and our pass at 12.8 GB (DeepSpeed's margin rule on the emulated 16 GB) at every length and repeated
    at 1024, all in the sweep named capacity."""
    expanded = [sweep_points(command, multirun=True) for command in capacity_commands()]
    budgeted = [point for points in expanded for point in points if "offload.budget_gb=12.8" in point]
    assert sorted((point[0], point[2]) for point in budgeted) == [
        ("train.repeat=0", "train.seq_len=1024"), ("train.repeat=0", "train.seq_len=2048"),
        ("train.repeat=0", "train.seq_len=4096"), ("train.repeat=0", "train.seq_len=8192"),
        ("train.repeat=1", "train.seq_len=1024"), ("train.repeat=2", "train.seq_len=1024")]
    assert all("arm=offload" in point for point in budgeted)
    cfg = compose_config(budgeted[0])
    assert cfg.sweep.name == "capacity" and cfg.env.device_memory_gb * (1 - cfg.offload.margin) == 12.8
    assert sum(len(points) for points in expanded) == 20 + 10 + 6
