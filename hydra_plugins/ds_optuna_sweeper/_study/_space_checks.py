"""Checks of a search space against the task's config: searched keys exist, config-group options exist.

Run on rank 0 before the study is opened, so a misspelled key or a missing option is refused before
any trial (cases C22, C44). Pure: no communication and no study.
"""

import difflib
from typing import Any, Callable, Sequence

from .._errors import SearchSpaceError, SweeperConfigError
from .._setting_keys import with_hint
from .._upstream import config_child_node
from ._search_space import SearchSpace


def check_group_options(space: SearchSpace, group_options: Callable[[str], list[str]]) -> None:
    """Refuse a ``choice``/``range`` over a config group whose options do not all exist (case C22): a missing
    option would fail only in the trial that draws it, and fixing the list is then a search-space change.

    Args:
        group_options: ``group name -> [option names]`` from Hydra's config repository (the
            config loader's ``get_group_options``); an empty list means "not a config group".

    Raises:
        SearchSpaceError: naming each missing option and the available ones.
    """
    problems = []
    for spec in space.params.values():
        group = spec.key.lstrip("+~").split("@", 1)[0]
        if spec.values is None:
            continue
        options = _options_of(group, group_options)
        if not options:
            continue
        missing = [v for v in spec.values if v is not None and str(v) not in options]
        if missing:
            problems.append(f"'{spec.key}={spec.expression}': no option {missing} in config group '{group}' "
                            f"(available: {sorted(options)})")
    if problems:
        raise SearchSpaceError(
            "Search space: " + "; ".join(problems) + ". Add the config file(s) or remove the option(s). Nothing "
            "was asked from the study and no rank started training."
        )


def check_param_keys(space: SearchSpace, config: Any, group_options: Callable[..., list[str]] | None) -> None:
    """Refuse a searched key that the task's config does not have and whose override does not add it (Hydra's
    "Could not override 'lrr'" would fail every trial at compose time). Keys written with ``+``, ``++`` or
    ``~``, package overrides (``@``), config groups and keys below a searched config group (their
    node depends on the option drawn) are left to Hydra.

    A key close to a config key or config group at the same level (``deepspeeed`` for the group
    ``deepspeed``, case C44; :data:`CLOSE_KEY_CUTOFF`) is named as the likely meant one; ``+key=...``
    (which adds a new key and would sweep a junk key) is advised only when nothing is close.

    Args:
        config: the config Hydra composed for the sweep (primary config and fixed overrides).
        group_options: as for :func:`check_group_options`; ``None`` treats no key as a config group.
            Called as ``group_options(path, groups=True)`` it lists the config groups below ``path``
            (``""``: the top level), for the suggestions; a callable without that keyword, or one that
            raises, gives no group suggestions.

    Raises:
        SearchSpaceError: naming each unknown key, and either the close key or group meant, or the
            ``+key=...`` form that adds it.
    """
    problems = _unknown_key_problems([spec.key for spec in space.params.values()], config, group_options)
    if problems:
        raise SearchSpaceError(
            "Search space: " + "; ".join(problems) + ". Nothing was asked from the study and no rank started training."
        )


def check_baseline_keys(baselines: Sequence[tuple[str, Sequence[str]]], config: Any,
                        group_options: Callable[..., list[str]] | None) -> None:
    """Refuse a ``refit.baselines`` key the task's config does not have, before the study is opened (a baseline
    runs after the whole search). The rules and suggestions are :func:`check_param_keys`'s.

    Args:
        baselines: ``((name, override lines), ...)`` (``Settings.refit_baselines``).
        config: the config Hydra composed for the sweep.
        group_options: as for :func:`check_param_keys`.

    Raises:
        SweeperConfigError: naming the baseline, each unknown key and the key or group likely meant.
    """
    for name, lines in baselines:
        problems = _unknown_key_problems([line.split("=", 1)[0] for line in lines], config, group_options)
        if problems:
            raise SweeperConfigError(
                f"hydra.sweeper.refit.baselines.{name}: " + "; ".join(problems) + ". Nothing was asked from the "
                "study and no rank started training.")


def _unknown_key_problems(keys: list[str], config: Any, group_options: Callable[..., list[str]] | None) -> list[str]:
    """One refusal per key of ``keys`` that ``config`` does not have (see :func:`check_param_keys`)."""
    groups = [key for key in keys if _options_of(key, group_options)]
    chosen = _chosen_groups(config)
    problems = []
    for key in keys:
        if key[0] in "+~" or "@" in key:
            continue
        if key in groups:
            if chosen is not None and key not in chosen:  # Hydra: "No match in the defaults list"
                problems.append(f"'{key}' is a config group that is not in the defaults list (write '+{key}=...' "
                                "to add it)")
            continue
        if any(key.startswith(g + ".") for g in groups):
            continue
        if "/" in key:  # a config group path (model/encoder): never a key '+' could add
            problem = _group_path_problem(key, chosen, group_options)
        else:
            problem = _missing_key_problem(key, config, chosen, group_options)
        if problem:
            problems.append(problem)
    return problems


def _missing_key_problem(key: str, config: Any, chosen: set[str] | None,
                         group_options: Callable[..., list[str]] | None) -> str | None:
    """The refusal for dotted ``key`` when a part of it is missing from ``config``, naming the close key or
    group meant or the ``+key=...`` form; ``None`` when the key exists or a list/value below decides."""
    from omegaconf import DictConfig

    node: Any = config
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):  # a list index or a value below: left to Hydra
            return None
        if part not in node.keys():
            level = ".".join(parts[:depth])
            below = _groups_below(level, group_options)
            meant = _close_names(part, [str(k) for k in node.keys()], below)
            last = depth == len(parts) - 1  # a group meant there is written as its path: model/encoder
            # a suggestion written as the key itself is no suggestion ('deepspeed.stage' where the group
            # deepspeed has no node of that name in the config): dropped
            fixes = [_group_as_written("/".join([*parts[:depth], m]), chosen)
                     if last and depth and m in below and m not in node.keys()
                     else _as_written([*parts[:depth], m, *parts[depth + 1:]], chosen, group_options)
                     for m in meant]
            fixes = [fix for fix in fixes if fix != f"'{key}'"]
            if not fixes:
                return f"'{key}' is not a key of the task's config (write '+{key}=...' to add it)"
            return (f"'{key}' is not a key or config group of the task's config (did you mean "
                    f"{' or '.join(fixes)}?)")
        node = config_child_node(node, part)
    return None


def _group_path_problem(key: str, chosen: set[str] | None,
                        group_options: Callable[..., list[str]] | None) -> str | None:
    """The refusal for ``key`` written as a config group path (``model/encoder``) that names no config group: the
    first missing part is replaced by the close group names there (case C44), else the groups there are listed;
    ``+key=...`` is never advised (a missing group cannot be added). ``None`` without a config loader."""
    if group_options is None:
        return None
    parts = key.split("/")
    for depth, part in enumerate(parts):
        parent = "/".join(parts[:depth])
        below = _groups_below(parent, group_options)
        if part in below:
            continue
        where = f"below '{parent}'" if parent else "at the top"
        meant = _close_names(part, [], below)
        if meant:
            fixes = " or ".join(_group_as_written("/".join([*parts[:depth], m, *parts[depth + 1:]]), chosen)
                                for m in meant)
            return f"'{key}' is not a config group (did you mean {fixes}?)"
        listed = f"config groups {where}: {sorted(below)}" if below else f"no config group {where}"
        return f"'{key}' is not a config group ({listed})"
    return None


def _group_as_written(group: str, chosen: set[str] | None) -> str:
    """``'group'`` as a suggestion, ``'+group'`` when the defaults list lacks it (Hydra only appends it)."""
    return f"'+{group}'" if chosen is not None and group not in chosen else f"'{group}'"


#: ``difflib`` ratio from which a config key or group counts as the one a searched name misspelled:
#: ``deepspeeed``/``deepspeed`` 0.95, ``lrr``/``lr`` 0.8, ``modle``/``model`` 0.8; ``xx``/``x`` (0.67)
#: is not close, so ``+xx=`` is advised there.
CLOSE_KEY_CUTOFF = 0.8


def _close_names(name: str, keys: list[str], groups: list[str]) -> list[str]:
    """Config keys and config groups (at one level) close to ``name``, best first, at most 3."""
    candidates = sorted((set(keys) | set(groups)) - {"hydra"})
    return difflib.get_close_matches(name, candidates, n=3, cutoff=CLOSE_KEY_CUTOFF)


def _chosen_groups(config: Any) -> set[str] | None:
    """The config groups in the composed defaults list (``hydra.runtime.choices``, null options included);
    ``None`` when the config does not say (no ``hydra`` node)."""
    try:
        return {str(k) for k in config.hydra.runtime.choices.keys()}
    except Exception:
        return None


def _as_written(parts: list[str], chosen: set[str] | None, group_options: Callable[..., list[str]] | None) -> str:
    """``'key'`` as a suggestion, ``'+key'`` for a config group the defaults list lacks (Hydra only appends it)."""
    key = ".".join(parts)
    plus = len(parts) == 1 and chosen is not None and key not in chosen and bool(_options_of(key, group_options))
    return f"'+{key}'" if plus else f"'{key}'"


def _groups_below(path: str, group_options: Callable[..., list[str]] | None) -> list[str]:
    """The config groups directly below ``path`` (dotted; ``""`` for the top)."""
    return _options_of(path.replace(".", "/"), group_options, groups=True)


def _options_of(group: str, group_options: Callable[..., list[str]] | None, **kwargs: bool) -> list[str]:
    """The options of config group ``group`` (``groups=True``: the groups below it); ``[]`` for a plain config key
    (not a path Hydra can list), without a config loader, or for a callable without the keyword."""
    if group_options is None:
        return []
    try:
        return [str(o) for o in group_options(group, **kwargs) or []]
    except Exception:  # not a path Hydra can list, or no ``groups`` keyword
        return []


def check_mutations(space: SearchSpace, mutations: tuple[str, ...]) -> None:
    """Refuse a PBT ``hydra.sweeper.scheduler.mutations`` entry that is not a param of the search space (a clone
    changes only searched params; the others are copied from the cloned member).

    Raises:
        SweeperConfigError: naming the unknown entries, the closest param names and the searched ones.
    """
    unknown = [m for m in mutations if m not in space.params]
    if unknown:
        hints = [with_hint(f"'{m}'", m, list(space.params)) for m in unknown]
        raise SweeperConfigError(
            f"hydra.sweeper.scheduler.mutations names {', '.join(hints)}, which the search space does not hold; a "
            f"PBT clone may change only searched params: {sorted(space.params)}. Nothing was run.")
