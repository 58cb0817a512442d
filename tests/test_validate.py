"""One validation for every key before launch: types, finiteness, ranges, model shapes, whatever the arm."""
import pytest
from omegaconf import OmegaConf

from conftest import schema_keys
from harness import arms
from harness.contract.checks import Choice, Number
from harness.config.compose import compose_point, resolve
from harness.contract.errors import ConfigError
from harness.driver.validate import validate


def config(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_point(list(overrides)), resolve=True)


def refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        validate(config(*overrides), gpu_count=0)
    return err.value


@pytest.mark.parametrize("override,key", [
    # a non-number where a number belongs
    ("launcher.timeout_s=abc", "launcher.timeout_s"),
    ("launcher.stall_timeout_s=abc", "launcher.stall_timeout_s"),
    ("offload.margin=abc", "offload.margin"),
    ("offload.budget_gb=abc", "offload.budget_gb"),
    ("offload.budget_fraction=half", "offload.budget_fraction"),
    ("train.lr=fast", "train.lr"),
    ("train.sub_group_size=big", "train.sub_group_size"),
    ("train.seed=1.5", "train.seed"),
    ("debug.fault_step=two", "debug.fault_step"),
    ("model.config.hidden_size=wide", "model.config.hidden_size"),
    ("launcher.rdzv_port=http", "launcher.rdzv_port"),
    # NaN and infinity pass every comparison; they are refused as such
    ("offload.budget_gb=nan", "offload.budget_gb"),
    ("offload.budget_gb=inf", "offload.budget_gb"),
    ("offload.margin=nan", "offload.margin"),
    ("train.lr=nan", "train.lr"),
    ("launcher.timeout_s=inf", "launcher.timeout_s"),
    ("env.reserved_cap_gb=inf", "env.reserved_cap_gb"),
    ("env.device_memory_gb=lots", "env.device_memory_gb"),
    ("model=qwen3_0.6b model.config.rope_theta=nan", "model.config.rope_theta"),
    # ranges
    ("train.lr=-1", "train.lr"),
    ("train.lr=0", "train.lr"),
    ("train.sub_group_size=-5", "train.sub_group_size"),
    ("train.sub_group_size=0", "train.sub_group_size"),
    ("train.repeat=-1", "train.repeat"),
    ("launcher.stall_timeout_s=0", "launcher.stall_timeout_s"),
    ("launcher.rdzv_port=70000", "launcher.rdzv_port"),
    ("debug.fault_sleep_s=-1", "debug.fault_sleep_s"),
    ("offload.budget_fraction=1.5", "offload.budget_fraction"),
    # model shapes
    ("model.config.hidden_size=-8", "model.config.hidden_size"),
    ("model.config.num_hidden_layers=0", "model.config.num_hidden_layers"),
    ("model.config.intermediate_size=-1", "model.config.intermediate_size"),
    ("model.config.vocab_size=1", "model.config.vocab_size"),
    ("model.config.num_attention_heads=7", "model.config.num_key_value_heads"),
    ("model.config.num_key_value_heads=3", "model.config.num_key_value_heads"),
    # options
    ("train.torch_adam=maybe", "train.torch_adam"),
    ("train.dtype=fp8", "train.dtype"),
    ("logger.mode=loud", "logger.mode"),
    ("launcher.rdzv_backend=etcd", "launcher.rdzv_backend"),  # the schema's choice; the node count's rule: nodes.py
    ("arm.phase_starts=[0,x]", "arm.phase_starts"),
    ("model.config.tie_word_embeddings=1", "model.config.tie_word_embeddings"),
])
def test_a_bad_value_of_any_kind_names_its_key(override, key):
    assert refusal(*override.split()).key == key


def test_the_line_says_what_was_expected_and_what_came():
    assert str(refusal("launcher.timeout_s=abc")) == "launcher.timeout_s: must be a finite number > 0, got 'abc'"
    assert str(refusal("offload.margin=nan")) == "offload.margin: must be a finite number in [0, 1), got nan"
    assert str(refusal("train.sub_group_size=-5")) == \
        "train.sub_group_size: must be null or a whole number >= 1, got -5"


def test_heads_must_split_the_hidden_size_unless_head_dim_sets_their_width():
    err = refusal("model.config.hidden_size=66", "model.config.head_dim=null")
    assert err.key == "model.config.num_attention_heads" and "66" in err.message
    validate(config("model.config.hidden_size=66"), gpu_count=0)  # tiny sets head_dim=16


@pytest.mark.parametrize("arm", sorted(arms.registered()))
@pytest.mark.parametrize("override,key", [
    ("offload.empty_cache=sometimes", "offload.empty_cache"),
    ("offload.streams=triple", "offload.streams"),
    ("offload.peak_cap_gb=-1", "offload.peak_cap_gb"),
    ("offload.budget_gb=-1", "offload.budget_gb"),
    ("offload.budget_rule=cheapest", "offload.budget_rule"),
    ("offload.budget_rule=step_model offload.peak_cap_gb=12", "offload.peak_cap_gb"),  # it places under its own peak
    ("offload.compose=selective_gather", "offload.compose"),  # selective gather only with prefetch
])
def test_every_arm_refuses_a_bad_offload_knob(arm, override, key):
    # a sweep over arms with a typo in the offload group refuses every point, not only arm=offload's
    assert refusal(f"arm={arm}", *override.split()).key == key


def test_null_sub_group_size_means_deepspeeds_default():
    typed = validate(config("train.sub_group_size=null"), gpu_count=0)
    assert "sub_group_size" not in typed.arm.deepspeed_config(typed, cuda=False)["zero_optimization"]
    default = validate(config(), gpu_count=0)
    assert default.arm.deepspeed_config(default, cuda=False)["zero_optimization"]["sub_group_size"] == 100_000_000


@pytest.mark.parametrize("overrides", [
    ["train.lr=1e-3"], ["train.reduce_bucket_size=5e7"], ["launcher.stall_timeout_s=null"],
    ["offload.budget_gb=0"], ["offload.budget_fraction=1"], ["model=llama3_8b"], ["train.seed=-3"],
    ["arm=offload", "offload.peak_cap_gb=12", "offload.release=ordered", "offload.budget_rule=deepspeed"],
    ["arm=offload", "offload.budget_gb=11", "offload.budget_rule=step_model"],
    ["arm=offload", "offload.compose=prefetch"], ["arm=offload", "offload.compose=prefetch_selective_gather"],
])
def test_good_values_pass(overrides):
    validate(config(*overrides), gpu_count=0)


def test_a_number_is_compared_with_its_type():
    whole = Number(low=1, whole=True)
    assert whole.accepts(5e7) and not whole.accepts(1.5) and not whole.accepts(True)
    assert not Number(integer=True).accepts(2.0)
    assert Number(low=0, high=1, high_open=True).describe() == "a finite number in [0, 1)"
    with pytest.raises(ConfigError) as err:
        Choice((True, False)).check("launcher.requeue", 1)  # 1 == True in Python, not in a config
    assert str(err.value) == "launcher.requeue: must be one of true, false, got 1"


def test_a_refused_config_still_gets_its_summary():
    # a sweep records every refused point; its summary must not trip over the values it refused
    from harness.driver.app import build_summary

    cfg = config("env.device_memory_gb=lots", "launcher.nnodes=two")
    summary = build_summary(cfg, "config_error", str(refusal("launcher.nnodes=two")), [], 0.0, {})
    assert summary["world_size"] is None and summary["device_memory_bytes"] is None
    assert summary["reason"].startswith("launcher.nnodes: ")


@pytest.mark.parametrize("overrides, key", [
    (["debug.fault=kill", "debug.fault_rank=1"], "debug.fault_rank"),  # one rank: rank 1 never exists
    (["debug.fault=hang", "train.measure_steps=1", "debug.fault_step=4"], "debug.fault_step"),  # steps 0-3
    (["train.dtype=fp16"], "train.dtype"),  # on a CPU machine (gpu_count 0)
])
def test_values_that_cannot_work_here_are_refused(overrides, key):
    assert refusal(*overrides).key == key


def test_a_fault_the_run_can_reach_and_fp16_on_a_gpu_pass():
    validate(config("debug.fault=kill", "launcher.nproc_per_node=2", "debug.fault_rank=1", "train.measure_steps=1",
                    "debug.fault_step=3"), gpu_count=0)
    validate(config("debug.fault_rank=5"), gpu_count=0)  # no fault: the rank is never used
    validate(config("train.dtype=fp16"), gpu_count=1)
    validate(config("train.dtype=fp16"), gpu_count=None)  # the estimate does not know the machine


@pytest.mark.parametrize("overrides, key", [
    (["+train.foo=1"], "train.foo"),
    (["+foo=1"], "foo"),
    (["+model.config.rope_scalin=2"], "model.config.rope_scalin"),
    (["+arm.fast=true"], "arm.fast"),
    (["~train.repeat"], "train.repeat"),
])
def test_keys_the_schema_does_not_have_or_lacks_are_refused(overrides, key):
    assert refusal(*overrides).key == key


def test_a_typo_in_an_experiment_is_refused_not_run_with_the_default(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "typo.yaml").write_text("# @package _global_\ntrain:\n  stpes: 3\n")
    cfg = OmegaConf.to_container(compose_point(["experiments=typo"], config_dirs=[tmp_path]), resolve=True)
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu_count=0)
    assert err.value.key == "train.stpes"


@pytest.mark.parametrize("override, key", [
    ("env.pytorch_cuda_alloc_conf=123", "env.pytorch_cuda_alloc_conf"),  # Popen's TypeError before
    ("arm.name=[1,2]", "arm.name"),  # W&B's pydantic error, after the launch, before
    ("model.name={a:1}", "model.name"),
    ("sweep.name=../../escape", "sweep.name"),
    ("sweep.name=.hidden", "sweep.name"),
])
def test_every_text_key_takes_text_only(override, key):
    assert refusal(override).key == key


NUMBER_KEYS = sorted(key for key, check in schema_keys().items() if isinstance(check, Number))


@pytest.mark.parametrize("key", NUMBER_KEYS)
def test_every_number_key_refuses_a_value_that_would_overflow(key):
    cfg = config()
    *parents, leaf = key.split(".")
    node = cfg
    for parent in parents:
        node = node[parent]
    node[leaf] = 1e300  # 1e300 GB is inf bytes; int(inf) raised OverflowError
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu_count=0)
    assert err.value.key == key
    from harness.driver.app import build_summary

    summary = build_summary(cfg, "config_error", str(err.value), [], 0.0, {})  # the refused point is recorded
    assert summary["status"] == "config_error" and summary["device_memory_bytes"] is None


def test_an_interpolation_that_cannot_resolve_names_its_key():
    with pytest.raises(ConfigError) as err:
        resolve(compose_point(["train.seq_len=${oc.env:HARNESS_TEST_UNSET}"]))
    assert str(err.value) == \
        "train.seq_len: cannot resolve '${oc.env:HARNESS_TEST_UNSET}': Environment variable 'HARNESS_TEST_UNSET' not found"
    with pytest.raises(ConfigError) as err:
        resolve(compose_point(["train.steps=${train.steps}"]))
    assert err.value.key == "train.steps"


def test_a_bad_compose_value_is_one_line_naming_the_key_and_the_choices():
    line = str(refusal("arm=offload", "offload.compose=all"))
    assert "\n" not in line and line.startswith("offload.compose: ")
    assert all(choice in line for choice in ("none", "prefetch", "prefetch_selective_gather"))
