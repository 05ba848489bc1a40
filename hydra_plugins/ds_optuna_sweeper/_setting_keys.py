"""Which ``hydra.sweeper`` keys exist and which sampler/pruner they choose: the refusals about keys.

Checks of the node's shape, not of its numbers (those are in :mod:`._setting_values`): unknown keys
(case C16), a sampler or pruner set as a value instead of a group option (C43), sampler/pruner keys
the ``_target_`` class does not take (C26), a sampler whose optional packages are missing, and
sweeper settings misplaced at the top of the task config (C15). Each message names the key, the bad
value and the fix.
"""

from __future__ import annotations

import difflib
from dataclasses import fields, is_dataclass
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from ._errors import SweeperConfigError
from .config import PRUNERS, SAMPLERS, SCHEDULERS, DSOptunaSweeperConf

#: Keys that configure the sweep, not the task; found at the top of the task config they are a
#: misplaced ``hydra.sweeper`` setting (case C15, facebookresearch/hydra#2047).
SWEEPER_ONLY_KEYS = ("direction", "n_trials", "study_name", "sampler", "pruner", "max_failure_rate", "n_jobs",
                     "custom_search_space", "rank_timeout", "sweeper")


def merge_onto_schema(values: Mapping[str, Any]) -> DictConfig:
    """Check the keys Hydra passed to the sweeper (``_``-prefixed ones ignored) against
    :class:`DSOptunaSweeperConf` and merge them onto it (typed, defaults filled in; sampler and pruner still configs).

    Raises:
        SweeperConfigError: for an unknown key (the message names it, suggests the nearest valid
            key and lists them all; case C16, facebookresearch/hydra#2313 and #2046) or a value of
            the wrong type.
    """
    valid = [f.name for f in fields(DSOptunaSweeperConf) if not f.name.startswith("_") and f.name != "defaults"]
    unknown = sorted(k for k in values if not str(k).startswith("_") and k not in valid and k != "defaults")
    if unknown:
        hints = [with_hint(f"'{key}'", key, valid) for key in unknown]
        raise SweeperConfigError(
            f"Unknown hydra.sweeper key(s) for hydra/sweeper=ds_optuna: {', '.join(hints)}. Valid keys: "
            f"{', '.join(valid)}. Keys of another sweeper's schema do not carry over; see the configuration "
            "reference (docs/reference/config.md). Nothing was run."
        )
    user = {k: v for k, v in values.items() if k in valid}
    schema = OmegaConf.structured(DSOptunaSweeperConf)
    try:
        return OmegaConf.merge(schema, OmegaConf.create(user, flags={"allow_objects": True}))
    except Exception as e:  # omegaconf.errors.ValidationError and friends
        raise SweeperConfigError(_merge_error_text(e)) from e


def with_hint(text: str, key: Any, valid: list[str]) -> str:
    """``text`` and, when a valid key is close to ``key``, `` (did you mean '<it>'?)``."""
    close = difflib.get_close_matches(str(key), valid, n=1)
    return text + (f" (did you mean '{close[0]}'?)" if close else "")


def _merge_error_text(e: Exception) -> str:
    """OmegaConf's merge error as the top-level check words it: the full ``hydra.sweeper.`` key, and for an
    unknown key inside a node (``stop.goall``) the nearest valid key and the node's valid keys."""
    full_key = getattr(e, "full_key", None)
    key, object_type = getattr(e, "key", None), getattr(e, "object_type", None)
    if isinstance(e, ConfigKeyError) and full_key and is_dataclass(object_type):
        valid = [f.name for f in fields(object_type)]
        node = str(full_key).rsplit(".", 1)[0]
        return (with_hint(f"Unknown hydra.sweeper key 'hydra.sweeper.{full_key}'", key, valid)
                + f". Valid keys of hydra.sweeper.{node}: {', '.join(valid)}. Nothing was run.")
    if full_key:
        message = str(getattr(e, "msg", "") or e).split("\n")[0]
        return f"Invalid hydra.sweeper setting hydra.sweeper.{full_key}: {message}. Nothing was run."
    return f"Invalid hydra.sweeper setting: {e}".replace("\n", " ")


def check_group_nodes(node: DictConfig) -> None:
    """Refuse a sampler, pruner or scheduler given as a value instead of a config-group option (case C43):
    ``hydra.sweeper.pruner=median`` sets the key to the string ``"median"`` without a word from Hydra.

    Raises:
        SweeperConfigError: naming the key, its value, the group override to write (the option closest to the
            value) and the group's options.
    """
    for group, options in (("sampler", SAMPLERS), ("pruner", PRUNERS), ("scheduler", SCHEDULERS)):
        if OmegaConf.is_missing(node, group):  # not composed (a settings dict built in code)
            continue
        value = node.get(group)
        if OmegaConf.is_dict(value):
            continue
        text = "null" if value is None else str(value)
        close = difflib.get_close_matches(text.lower().rsplit(".", 1)[-1].replace("sampler", "").replace("pruner", "")
                                          .replace("scheduler", ""),
                                          list(options), n=1, cutoff=0.5)
        # null: the group's default option (tpe, nop: no pruning), the first one listed in config.py
        option = next(iter(options)) if value is None else close[0] if close else "<option>"
        raise SweeperConfigError(
            f"hydra.sweeper.{group}={text} sets the key to a plain value, but the {group} is a config group: "
            f"choose it with hydra/sweeper/{group}={option} (a slash, not a dot), then set its arguments as "
            f"hydra.sweeper.{group}.<argument>=<value>. Options of hydra/sweeper/{group}: {', '.join(options)}. "
            "Nothing was run."
        )


#: Packages a sampler imports only when it first samples (Optuna's ``_LazyImport`` in ``optuna/samplers/``),
#: none of which ``optuna`` itself installs.
SAMPLER_NEEDS: dict[str, tuple[str, ...]] = {
    "optuna.samplers.CmaEsSampler": ("cmaes",),
    "optuna.samplers.QMCSampler": ("scipy",),
    "optuna.samplers.GPSampler": ("scipy", "torch"),
}


def check_sampler_needs(node: Any) -> None:
    """Refuse a sampler whose optional packages are missing, naming the ``pip install`` line, before the study is
    asked (else ``cmaes`` without its package trains trial 0, then fails at the first CMA-ES ask)."""
    import importlib.util

    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        return
    target = str(node._target_)
    missing = []
    for module in SAMPLER_NEEDS.get(target, ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (import blocked)
            found = False
        if not found:
            missing.append(module)
    if missing:
        raise SweeperConfigError(
            f"hydra.sweeper.sampler {target} needs the Python package(s) {', '.join(missing)}, which are not "
            f"installed here (Optuna installs them only on request): pip install {' '.join(missing)}. "
            "Nothing was asked from the study."
        )


def check_target_keys(node: Any, group: str, options: Mapping[str, Any]) -> None:
    """Refuse a ``_target_`` that cannot be imported, or sampler/pruner keys its class does not take (case C26):
    setting ``hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler`` keeps the composed option's keys
    (TPE's ``n_startup_trials``...), and the class then fails with a bare ``TypeError`` (facebookresearch/hydra#2003).
    """
    import inspect

    from hydra.utils import get_class

    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        return
    target = str(node._target_)
    try:
        params = inspect.signature(get_class(target)).parameters
    except Exception as e:
        raise SweeperConfigError(f"hydra.sweeper.{group}._target_={target} cannot be imported: {e}") from e
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(str(k) for k in node if not str(k).startswith("_") and k not in params)
    if not unknown:
        return
    own = ", ".join(p for p in params if p != "self") or "none"
    fits = [name for name, schema in options.items() if schema._target_ == target]
    fix = (
        f"Choose the class with hydra/sweeper/{group}={fits[0]} (its keys then follow), not with "
        f"{group}._target_, and set only its own keys" if fits else f"Give only {target}'s own arguments"
    )
    raise SweeperConfigError(
        f"hydra.sweeper.{group} has key(s) {unknown} that {target} does not take (its arguments: {own}): a key "
        f"added to hydra.sweeper.{group}, or the keys of another hydra/sweeper/{group} option kept when "
        f"_target_ was changed. {fix}. Nothing was run."
    )


def warn_misplaced_keys(config: DictConfig, directions: tuple[str, ...], study_name: str) -> None:
    """Warn about sweeper settings at the top of the task config (case C15, facebookresearch/hydra#2047)."""
    import logging

    misplaced = [k for k in SWEEPER_ONLY_KEYS if k in config and k != "hydra"]
    if misplaced:
        logging.getLogger(__name__).warning(
            "Key(s) %s at the top level of the task config look like sweeper settings, but only "
            "hydra.sweeper.* configures the sweep: they are ignored by the sweeper (effective direction %s, "
            "study '%s'). Move them under hydra: sweeper:, or rename them if they belong to your task.",
            misplaced, list(directions), study_name)
