"""The config Hydra would compose for a command line, and the points a sweep expands to, without running or
writing anything (for the dry-run estimate, the SLURM preview and the tests)."""
from __future__ import annotations

import os

from harness.envinfo import REPO_ROOT
from harness.errors import ConfigError

CONF_DIR = REPO_ROOT / "conf"


def compose_point(overrides: list[str], with_hydra: bool = False, multirun: bool = False):
    """The config Hydra would compose for these overrides (nothing is run or written); `multirun`
    composes a sweep's primary config, where comma lists are allowed."""
    os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))
    from hydra import initialize_config_dir

    from harness import dirnames
    dirnames.register()
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = GlobalHydra.instance().hydra.compose_config(
                "config", list(overrides), run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN, from_shell=False)
        except HydraException as error:
            raise ConfigError("overrides", str(error).splitlines()[0]) from error
    if not with_hydra:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def sweep_points(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Each point's overrides, as Hydra's basic sweeper expands them: the config's
    hydra.sweeper.params, then the command line's comma lists (the command line wins)."""
    if not multirun:
        return [list(overrides)]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = compose_point(overrides, with_hydra=True, multirun=True).hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(overrides))
    return BasicSweeper.split_arguments(parsed, None)[0]
