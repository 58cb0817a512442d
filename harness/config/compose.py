"""The config Hydra would compose for a command line, and the points a sweep expands to, without running or
writing anything (for the dry-run estimate, the SLURM preview and the tests); what Hydra itself would refuse in a
command line, as one line naming the key, before Hydra starts a sweep; and a composed config resolved, an
interpolation that fails named by its key."""
from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from harness.contract.envinfo import REPO_ROOT
from harness.contract.checks import lookup, shown
from harness.contract.errors import ConfigError

CONF_DIR = REPO_ROOT / "conf"
# Hydra's flags that show something instead of running: its own output is the answer, nothing to check first.
_SHOWING_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun")


@contextmanager
def _hydra(config_dirs: Sequence[str | Path] = ()) -> Iterator[Any]:
    """Hydra set up as `python -m harness.run [--config-dir DIR]` sets it up (conf/, then DIR before the schema
    entry), for the duration of the block; the process's own Hydra state is restored after."""
    os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from harness.config import dirnames
    dirnames.register()
    backup = get_gh_backup()
    version.setbase("1.3")
    search_path = create_config_search_path(str(CONF_DIR))
    for config_dir in config_dirs:
        search_path.prepend(provider="command-line", path=f"file://{os.path.abspath(config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    try:
        yield Hydra.create_main_hydra2(task_name="run", config_search_path=search_path)
    finally:
        restore_gh_from_backup(backup)


def _compose(hydra, overrides: Sequence[str], multirun: bool):
    """Hydra's composition of one config; its refusal as a ConfigError naming the key."""
    from hydra.types import RunMode

    try:
        return hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN,
                                    from_shell=False)
    except Exception as error:  # Hydra refuses input with its own errors, OmegaConf's and plain ValueErrors alike
        raise hydra_refusal(error, overrides) from None


def compose_point(overrides: list[str], with_hydra: bool = False, multirun: bool = False,
                  config_dirs: Sequence[str | Path] = ()):
    """The config Hydra would compose for these overrides (nothing is run or written); `multirun`
    composes a sweep's primary config, where comma lists are allowed."""
    with _hydra(config_dirs) as hydra:
        cfg = _compose(hydra, overrides, multirun)
    if not with_hydra:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def sweep_points(overrides: list[str], multirun: bool, config_dirs: Sequence[str | Path] = ()) -> list[list[str]]:
    """Each point's overrides, as Hydra's basic sweeper expands them: the config's
    hydra.sweeper.params, then the command line's comma lists (the command line wins)."""
    if not multirun:
        return [list(overrides)]
    return _expand(compose_point(overrides, with_hydra=True, multirun=True, config_dirs=config_dirs), overrides)


def _expand(primary, overrides: Sequence[str]) -> list[list[str]]:
    """The points of a sweep whose primary config (with hydra) is `primary`."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = primary.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(overrides))
    return BasicSweeper.split_arguments(parsed, None)[0]


# --- what Hydra would refuse, before it starts ----------------------------------------------------------------

_QUOTED_KEY = re.compile(r"'([^'\s]+)'")
# Hydra's words for its refusals, and ours for what they mean to the user.
_REFUSALS = {"Could not override": "unknown key (the config has no such key)",
             "Could not append to config": "already in the config: drop the '+'",
             "Could not delete from config": "not in the config, nothing to delete"}


def hydra_refusal(error: Exception, overrides: Sequence[str]) -> ConfigError:
    """Hydra's (or OmegaConf's) multi-line refusal as one ConfigError: the key it names, what it means."""
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    named = _QUOTED_KEY.search(first_line)
    key = named.group(1).lstrip("+~").split("=", 1)[0] if named else _override_key(overrides, first_line)
    meaning = next((ours for theirs, ours in _REFUSALS.items() if first_line.startswith(theirs)), first_line)
    return ConfigError(key, meaning)


def _override_key(overrides: Sequence[str], text: str) -> str:
    """The key of the override a message quotes, else 'overrides'."""
    for override in overrides:
        if override in text:
            return override.lstrip("+~").split("=", 1)[0]
    return "overrides"


def check_syntax(overrides: Sequence[str]) -> None:
    """Each override alone through Hydra's grammar, so a syntax error names its own key. A number too long for
    Python to read (thousands of digits: Hydra's parser raises a ValueError) is refused the same way."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        try:
            parser.parse_override(override)
        except HydraException as error:
            first_line = (str(error).strip().splitlines() or ["cannot parse"])[-1]
            raise ConfigError(key, f"cannot parse {shown(override)}: {first_line}") from None
        except ValueError:
            digits = sum(char.isdigit() for char in override.partition("=")[2])
            raise ConfigError(key, f"a number of {digits} digits, more than Python reads "
                              f"({sys.get_int_max_str_digits()})") from None


def check_command_line(args: list[str]) -> None:
    """Refuse, as one ConfigError, what Hydra would refuse with an error of its own once it runs: an override it
    cannot parse, a key the config does not have in any point of a sweep (Hydra would end the sweep there, its
    index unwritten), and a sweep name that is not one folder. Nothing is run or written."""
    from hydra._internal.utils import get_args_parser

    parsed = get_args_parser().parse_args(args)
    if any(getattr(parsed, flag, None) for flag in _SHOWING_FLAGS) or parsed.config_path or parsed.config_name:
        return  # Hydra shows, or the user chose another config: Hydra answers for itself
    if parsed.config_dir and not Path(parsed.config_dir).is_dir():
        raise ConfigError("--config-dir", f"{parsed.config_dir}: not a directory")
    overrides = list(parsed.overrides)
    check_syntax(overrides)
    with _hydra([parsed.config_dir] if parsed.config_dir else []) as hydra:
        points = [overrides]
        if parsed.multirun:  # the sweep folder is named from the primary config's sweep.name
            primary = _compose(hydra, overrides, multirun=True)
            check_sweep_name(primary)
            points = _expand(primary, overrides)
        for point in points:
            try:
                _compose(hydra, point, multirun=False)
            except ConfigError as error:
                where = f" (in the point {' '.join(point)})" if len(points) > 1 else ""
                raise ConfigError(error.key, error.message + where) from None


def check_sweep_name(cfg) -> None:
    """sweep.name names the sweep's folder under multirun/: it must resolve to a plain name."""
    from harness.contract import schema

    sweep = resolve(cfg.sweep, prefix="sweep")
    try:
        schema.check_group("sweep", {"sweep": sweep}, part=schema.SweepConfig)
    except ConfigError as error:
        raise hide_interpolated(error, cfg, {"sweep": sweep}) from None


# --- resolving ---------------------------------------------------------------------------------------------------

_RESOLVER_RAISED = re.compile(r"^\w+ raised while resolving interpolation: ")


def resolve(cfg, prefix: str = "") -> dict[str, Any]:
    """The config (a DictConfig) as plain data with every interpolation resolved; ConfigError naming the first key
    whose value cannot be resolved (a missing environment variable, a key that is not there, a loop)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as error:  # a resolver may raise anything
        key, raw, cause = _unresolvable(cfg, prefix) or (prefix or "config", None, error)
        first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        first_line = _RESOLVER_RAISED.sub("", first_line).strip("\"")
        raise ConfigError(key, f"cannot resolve {raw!r}: {first_line}" if raw is not None else first_line) from None


def _unresolvable(cfg, prefix: str) -> tuple[str, Any, Exception] | None:
    """(key, value as written, error) of the first value that cannot be resolved, depth first."""
    from omegaconf import OmegaConf

    for name, raw in OmegaConf.to_container(cfg, resolve=False).items():
        key = f"{prefix}.{name}" if prefix else str(name)
        try:
            value = cfg[name]  # resolves a value; a section's values stay unresolved until read
            if isinstance(raw, dict):
                found = _unresolvable(value, key)
                if found:
                    return found
            elif OmegaConf.is_config(value):
                OmegaConf.to_container(value, resolve=True)
        except Exception as error:  # a resolver may raise anything
            return key, raw, error
    return None


# --- what an error may quote ---------------------------------------------------------------------------------------

INTERPOLATED = "a value from an interpolation (not shown)"


def hide_interpolated(error: ConfigError, cfg, resolved: Mapping[str, Any]) -> ConfigError:
    """The error without the values that came from interpolations: an environment variable (`${oc.env:...}`) may
    hold a secret, and the error line goes to the console and into summary.json. `cfg` is the config as written
    (a DictConfig), `resolved` the same config resolved."""
    from omegaconf import OmegaConf

    message = error.message
    for key, raw in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        value = lookup(resolved, key, None)
        if isinstance(raw, str) and "${" in raw and (isinstance(value, str) or key == error.key):
            for quoted in dict.fromkeys((shown(value), repr(value))):
                message = message.replace(quoted, INTERPOLATED)
    return error if message == error.message else ConfigError(error.key, message)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value as written) of every value below a section."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            yield from _leaves(value, f"{prefix}.{name}" if prefix else str(name))
    else:
        yield prefix, node
