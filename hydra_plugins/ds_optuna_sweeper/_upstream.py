"""The one place that touches Optuna, Hydra, OmegaConf and torch private APIs: each function names the private
API it uses and the version checked, keeps no policy of its own, and has a sentinel test in
``tests/test_upstream_sentinels.py`` that fails loudly when upstream moves it. Version bounds: ``pyproject.toml``.
"""

from __future__ import annotations

# --- Hydra override grammar, OmegaConf nodes, Optuna distributions (config side) -------------------


def escape_override_text(text: str) -> str:
    """``text`` with Hydra's grammar characters backslash-escaped, for the right side of an override.
    Private API: ``hydra._internal.grammar.utils.escape_special_characters`` (hydra-core 1.3)."""
    from hydra._internal.grammar.utils import escape_special_characters

    return escape_special_characters(text)


def plain_override_value(value: object) -> object:
    """A parsed override value (or one ``choice`` element) as the plain value Hydra gives the task: a
    ``QuotedString`` becomes its ``str``, lists and dicts element by element, other values as they are.
    Private API: ``hydra.core.override_parser.types.Override._convert_value`` (static, hydra-core 1.3)."""
    from hydra.core.override_parser.types import Override

    return Override._convert_value(value)


def config_child_node(node: object, key: str) -> object:
    """The child node ``key`` of an OmegaConf ``DictConfig``, without resolving interpolations (``node[key]``
    would, and fail on a missing one). Private API: ``omegaconf.basecontainer.BaseContainer._get_node`` (2.3)."""
    return node._get_node(key)  # type: ignore[attr-defined]


def distribution_contains(dist: object, value: object) -> bool:
    """Whether ``value`` (an external value: a float, an int or a choice) lies in the Optuna distribution; raises
    ``ValueError`` (from ``to_internal_repr``) for one it cannot represent (NaN, a non-choice, <= 0 on a log scale).
    Private API: ``optuna.distributions.BaseDistribution._contains`` (optuna 5.0), as ``Study.enqueue_trial`` uses.
    """
    return bool(dist._contains(dist.to_internal_repr(value)))  # type: ignore[attr-defined]


# --- Optuna study and storage internals (study side; checked on optuna 5.0) -----------------------


def study_storage(study: object) -> object:
    """The storage object behind ``study`` (Optuna's ``_CachedStorage`` around an ``RDBStorage``, or
    the storage itself). Private API: ``optuna.Study._storage``."""
    return study._storage  # type: ignore[attr-defined]


def study_id(study: object) -> int:
    """The storage id of ``study``. Private API: ``optuna.Study._study_id``."""
    return study._study_id  # type: ignore[attr-defined]


def trial_id(trial: object) -> int:
    """The storage id of an asked ``optuna.Trial`` or a ``FrozenTrial``. Private API: ``Trial._trial_id``
    (``FrozenTrial._trial_id``)."""
    return trial._trial_id  # type: ignore[attr-defined]


def stored_trial(study: object, trial: object) -> object:
    """The ``FrozenTrial`` the storage holds now for ``trial`` (an asked ``optuna.Trial``), not as this process
    last saw it. Private API: ``Study._storage.get_trial`` with ``Trial._trial_id``."""
    return study_storage(study).get_trial(trial_id(trial))  # type: ignore[attr-defined]


def asked_trial_frozen(trial: object) -> object:
    """The ``FrozenTrial`` an asked ``optuna.Trial`` read when it was made (``study.ask``), plus what the trial
    set since (``set_user_attr``, ``report``, params), without another storage read; not what other processes
    wrote since. Private API: ``Trial._cached_frozen_trial``."""
    return trial._cached_frozen_trial  # type: ignore[attr-defined]


def stored_trial_by_number(study: object, number: int) -> object:
    """The stored ``FrozenTrial`` numbered ``number`` of ``study``. Raises ``KeyError`` when there is none.
    Private API: ``Study._storage.get_trial_id_from_study_id_trial_number`` and ``get_trial``."""
    storage = study_storage(study)
    return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id(study), number))  # type: ignore[attr-defined]


def all_trials(study: object) -> list:
    """Every stored ``FrozenTrial`` of ``study``, not copied, read from the storage (what a sampler sees
    in ``before_trial``). Private API: ``Study._storage.get_all_trials(Study._study_id, deepcopy=False)``."""
    return study_storage(study).get_all_trials(study_id(study), deepcopy=False)  # type: ignore[attr-defined]


def create_trial_from_template(study: object, template: object) -> int:
    """Store a new trial of ``study`` made from ``template`` (a ``FrozenTrial``, e.g. WAITING with system
    attributes, as ``Study.enqueue_trial`` does) and return its number. Private API:
    ``Study._storage.create_new_trial(study_id, template_trial=...)`` and ``get_trial_number_from_id``."""
    storage = study_storage(study)
    new_id = storage.create_new_trial(study_id(study), template_trial=template)  # type: ignore[attr-defined]
    return int(storage.get_trial_number_from_id(new_id))  # type: ignore[attr-defined]


def set_trial_system_attr(study: object, trial: object, key: str, value: object) -> None:
    """Store a system attribute on ``trial`` (a ``FrozenTrial`` in ``before_trial``), as Optuna's own
    ``GridSampler`` does. Private API: ``Study._storage.set_trial_system_attr`` with ``_trial_id``."""
    study_storage(study).set_trial_system_attr(trial_id(trial), key, value)  # type: ignore[attr-defined]


def storage_heartbeat_interval(study: object) -> int | None:
    """Seconds between heartbeats of ``study``'s storage, or ``None`` when it records none. Private API:
    ``Study._storage.get_heartbeat_interval`` (present on heartbeat-capable storages only)."""
    getter = getattr(study_storage(study), "get_heartbeat_interval", None)
    return getter() if getter else None


def storage_backend(study: object) -> object:
    """The storage under Optuna's cache layer: ``Study._storage._backend`` when the storage is a
    ``_CachedStorage``, else ``Study._storage``. Private API: both attributes."""
    storage = getattr(study, "_storage", None)
    return getattr(storage, "_backend", storage)


def storage_location(storage: object) -> tuple[str, str]:
    """What kind of storage ``storage`` (a study's ``_storage``) is and where it lives, for owner locks:
    ``("sqlite", <database file>)``, ``("postgresql", <URL>)``, ``("journal_file", <log file>)``,
    ``("redis", <URL>)``, or ``("other", "")`` (in memory, MySQL, another storage class). Private API:
    ``_CachedStorage._backend``, ``JournalStorage._backend``, ``JournalFileBackend._file_path``,
    ``JournalRedisBackend._url`` (Optuna 4-5)."""
    import optuna
    from optuna.storages._cached_storage import _CachedStorage

    if isinstance(storage, _CachedStorage):
        storage = storage._backend
    if isinstance(storage, optuna.storages.RDBStorage):
        from sqlalchemy.engine import make_url

        url = make_url(storage.url)
        scheme = url.get_backend_name()
        if scheme == "sqlite":
            return ("sqlite", url.database) if url.database and url.database != ":memory:" else ("other", "")
        return ("postgresql", storage.url) if scheme == "postgresql" else ("other", "")
    if isinstance(storage, optuna.storages.JournalStorage):
        from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

        backend = storage._backend
        if isinstance(backend, JournalFileBackend):
            return "journal_file", str(backend._file_path)
        if isinstance(backend, JournalRedisBackend):
            return "redis", str(backend._url)
    return "other", ""


def rdb_models() -> object:
    """Optuna's SQLAlchemy models of the RDB schema. Private API: ``optuna.storages._rdb.models``."""
    from optuna.storages._rdb import models

    return models


#: ``RDBStorage`` private methods that ``_retry.RetryingRDBStorage`` wraps or overrides, with the arguments it
#: passes (a sentinel test checks them).
RDB_PRIVATE_METHODS: dict[str, tuple[str, ...]] = {
    "_create_new_trial": ("study_id", "template_trial"),
    "_get_prepared_new_trial": ("study_id", "template_trial", "session"),
    "_get_trials": ("study_id", "states", "included_trial_ids", "trial_id_greater_than"),
    "_get_best_trial_id": (),
    "_get_stale_trial_ids": (),
    "_set_trial_param": (),
}


# --- Optuna's GridSampler internals (_grid.WarmStartGridSampler) ----------------------------------


def grid_points(sampler: object) -> tuple[list[str], list[tuple]]:
    """``(param names, every grid point as a tuple in that order)`` of an Optuna ``GridSampler``.
    Private API: ``GridSampler._param_names`` and ``GridSampler._all_grids``."""
    return list(sampler._param_names), list(sampler._all_grids)  # type: ignore[attr-defined]


def grid_size(sampler: object) -> int:
    """How many points the ``GridSampler``'s grid holds. Private API: ``GridSampler._n_min_trials``."""
    return int(sampler._n_min_trials)  # type: ignore[attr-defined]


def grid_search_space(sampler: object) -> dict:
    """The ``GridSampler``'s grid as it stores it in a trial's ``search_space`` system attribute.
    Private API: ``GridSampler._search_space``."""
    return sampler._search_space  # type: ignore[attr-defined]


def grid_same_space(sampler: object, search_space: object) -> bool:
    """Whether a trial's stored ``search_space`` is this ``GridSampler``'s grid. Private API:
    ``GridSampler._same_search_space``."""
    return bool(sampler._same_search_space(search_space))  # type: ignore[attr-defined]


# --- Hydra's JobReturn (the runner), torch ------------------------------------------------------


def job_return_value(ret: object) -> object:
    """What the task of a Hydra job returned, or the exception it raised, without raising it or
    printing "Error executing job" (the public ``JobReturn.return_value`` does both for a failed job).
    Private API: ``hydra.core.utils.JobReturn._return_value`` (hydra-core 1.3)."""
    return ret._return_value  # type: ignore[attr-defined]


def cuda_runtime_device_count() -> int:
    """The number of GPUs this process's CUDA runtime sees (fixed at its first use, unlike the NVML count of
    ``torch.cuda.device_count()`` before it), or -1 without CUDA.
    Private API: ``torch._C._cuda_getDeviceCount`` (torch 2.x)."""
    import torch

    if not torch.backends.cuda.is_built():
        return -1
    try:
        return int(torch._C._cuda_getDeviceCount())
    except Exception:
        return -1
