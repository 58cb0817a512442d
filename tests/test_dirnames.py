"""Point folder names stay under the filesystem's 255-byte name limit whatever the overrides."""
from harness.config.dirnames import MAX_BYTES, bounded_dirname
from harness.contract.runfiles import job_order


def overrides(n: int, value: str = "x") -> str:
    return ",".join(f"model.config.key_number_{i}={value}" for i in range(n))


def test_a_short_list_is_the_folder_name_as_it_is():
    assert bounded_dirname("arm=zero3,train.micro_batch=2") == "arm=zero3,train.micro_batch=2"
    assert bounded_dirname("") == ""


def test_a_long_list_is_cut_to_whole_overrides_plus_a_hash_of_all_of_it():
    long = overrides(30)
    name = bounded_dirname(long)
    head, digest = name.rsplit("~", 1)
    assert len(name.encode()) <= MAX_BYTES and len(f"123456_{name}".encode()) < 255
    assert long.startswith(head + ",") and len(digest) == 10
    assert bounded_dirname(overrides(30, "y")) != name  # same start, other list: another folder
    assert bounded_dirname(long) == name  # the same list always gets the same folder
    assert job_order(f"12_{name}")[0] == 12  # the job number prefix still orders the sweep


def test_multibyte_values_are_never_cut_in_half():
    name = bounded_dirname("train.note=" + "é" * 300)
    assert len(name.encode()) <= MAX_BYTES
    name.encode().decode()  # valid UTF-8


def test_a_value_never_makes_the_name_a_path():
    for value in ("a/b", "../../../../esc", "..", "a\\b", "x\x00y", "line\nbreak", "/abs", "'${oc.env:UNSET}'"):
        name = bounded_dirname(f"env.pytorch_cuda_alloc_conf={value}")
        assert "/" not in name and "\\" not in name and ".." not in name and "\x00" not in name and "\n" not in name
        assert "${" not in name  # never an interpolation where Hydra stores the folder
    assert bounded_dirname("env.pytorch_cuda_alloc_conf=../x") == "env.pytorch_cuda_alloc_conf=%2E.%2Fx"
    assert bounded_dirname("a=%2F") != bounded_dirname("a=/")  # `%` is escaped too: two lists, two names
    assert len(bounded_dirname("train.note=" + "/" * 300).encode()) <= MAX_BYTES


def test_the_name_is_read_from_the_overrides_as_written():
    """Hydra resolves `${...}` in hydra.job.override_dirname when it is read; the folder name must not."""
    from omegaconf import OmegaConf, open_dict

    from harness.config.compose import compose_point

    cfg = compose_point(["env.pytorch_cuda_alloc_conf=${oc.env:HARNESS_TEST_UNSET}"], with_hydra=True)
    with open_dict(cfg):
        cfg.hydra.job.num = 3
    # `$` is escaped: Hydra keeps the folder as hydra.runtime.output_dir, where a `${...}` would be resolved after all
    assert OmegaConf.select(cfg, "hydra.sweep.subdir") == "3_env.pytorch_cuda_alloc_conf=%24{oc.env:HARNESS_TEST_UNSET}"
