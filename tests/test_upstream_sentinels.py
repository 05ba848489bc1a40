"""Sentinels for the Optuna, Hydra and OmegaConf private APIs the sweeper uses (``_upstream.py``).

One test per adapter function: each runs the function against the installed upstream (real Optuna
studies on real storages, no mocks) and fails with a message naming the private API when an
upstream release moves or changes it. Helpers add the tests of the functions they add.
"""

from __future__ import annotations

import inspect

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper import _upstream as upstream

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path, name="s", **kwargs):
    return optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 'o.db'}", **kwargs)


# --- Optuna study and storage internals -------------------------------------------------------------


def test_study_storage_and_ids(tmp_path):
    study = _study(tmp_path)
    storage = upstream.study_storage(study)
    assert hasattr(storage, "get_trial"), "optuna.Study._storage changed"
    assert storage.get_study_name_from_id(upstream.study_id(study)) == "s", "optuna.Study._study_id changed"


def test_trial_id_of_an_asked_and_a_frozen_trial(tmp_path):
    study = _study(tmp_path)
    trial = study.ask()
    frozen = study.trials[0]
    assert upstream.trial_id(trial) == upstream.trial_id(frozen), "Trial._trial_id / FrozenTrial._trial_id changed"


def test_stored_trial_sees_the_state_another_handle_stored(tmp_path):
    study = _study(tmp_path)
    trial = study.ask()
    optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}").tell(trial.number, state=TrialState.FAIL)
    assert upstream.stored_trial(study, trial).state == TrialState.FAIL, "Study._storage.get_trial changed"


def test_stored_trial_by_number(tmp_path):
    study = _study(tmp_path)
    study.ask()
    study.ask()
    assert upstream.stored_trial_by_number(study, 1).number == 1
    with pytest.raises(KeyError):
        upstream.stored_trial_by_number(study, 5)


def test_all_trials_uncopied(tmp_path):
    study = _study(tmp_path)
    study.ask()
    assert [t.number for t in upstream.all_trials(study)] == [0], "Study._storage.get_all_trials changed"


def test_create_trial_from_template_returns_its_number_and_is_asked_first(tmp_path):
    study = _study(tmp_path)
    study.ask()
    number = upstream.create_trial_from_template(study, optuna.trial.create_trial(
        state=TrialState.WAITING, system_attrs={"fixed_params": {"x": 0.5}}, user_attrs={"k": True}))
    assert number == 1
    asked = study.ask()
    assert asked.number == 1 and asked.suggest_float("x", 0, 1) == 0.5, "a WAITING template trial is no longer asked"


def test_set_trial_system_attr(tmp_path):
    study = _study(tmp_path)
    trial = study.ask()
    upstream.set_trial_system_attr(study, study.trials[0], "grid_id", 3)
    assert study.trials[trial.number].system_attrs["grid_id"] == 3


def test_storage_heartbeat_interval(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    beating = optuna.create_study(storage=optuna.storages.RDBStorage(url, heartbeat_interval=7), study_name="b")
    assert upstream.storage_heartbeat_interval(beating) == 7, "RDBStorage.get_heartbeat_interval changed"
    assert not upstream.storage_heartbeat_interval(_study(tmp_path))
    assert not upstream.storage_heartbeat_interval(optuna.create_study())  # in memory: no heartbeat


def test_storage_backend_is_the_rdb_storage_under_the_cache(tmp_path):
    study = _study(tmp_path)
    assert isinstance(upstream.storage_backend(study), optuna.storages.RDBStorage), "_CachedStorage._backend changed"


def test_storage_location_names_each_owner_lock_storage(tmp_path):
    from optuna.storages.journal import JournalFileBackend

    assert upstream.storage_location(_study(tmp_path)._storage)[0] == "sqlite", "_CachedStorage._backend/RDBStorage.url"
    journal = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "j.log")))
    assert upstream.storage_location(journal) == ("journal_file", str(tmp_path / "j.log")), \
        "JournalStorage._backend or JournalFileBackend._file_path changed"
    assert upstream.storage_location(optuna.storages.InMemoryStorage()) == ("other", "")


def test_rdb_models_have_the_tables_retry_queries():
    models = upstream.rdb_models()
    for name in ("TrialModel", "TrialSystemAttributeModel"):
        assert hasattr(models, name), f"optuna.storages._rdb.models.{name} is gone"
    assert {"key", "value_json", "trial"} <= set(dir(models.TrialSystemAttributeModel))


@pytest.mark.parametrize("name", sorted(upstream.RDB_PRIVATE_METHODS))
def test_rdb_private_methods_retry_wraps_still_exist(name):
    method = getattr(optuna.storages.RDBStorage, name, None)
    assert method is not None, f"RDBStorage.{name} is gone (_retry.RetryingRDBStorage wraps it)"
    params = list(inspect.signature(method).parameters)[1:]
    expected = list(upstream.RDB_PRIVATE_METHODS[name])
    assert params[: len(expected)] == expected, f"RDBStorage.{name} takes {params} now"


# --- Optuna's GridSampler internals -------------------------------------------------------------------


def test_grid_internals():
    space = {"x": [1, 2], "y": ["a", "b", "c"]}
    sampler = optuna.samplers.GridSampler(space, seed=0)
    names, points = upstream.grid_points(sampler)
    assert sorted(names) == ["x", "y"] and len(points) == 6 and all(len(p) == 2 for p in points)
    assert {(p[names.index("x")], p[names.index("y")]) for p in points} == {(x, y) for x in [1, 2] for y in "abc"}
    assert upstream.grid_size(sampler) == 6
    stored = upstream.grid_search_space(sampler)
    assert upstream.grid_same_space(sampler, stored) and not upstream.grid_same_space(sampler, {"x": [1]})


def test_grid_sampler_stores_the_system_attrs_the_warm_start_grid_reads(tmp_path):
    study = _study(tmp_path, sampler=optuna.samplers.GridSampler({"x": [1, 2]}, seed=0))
    study.optimize(lambda t: t.suggest_categorical("x", [1, 2]), n_trials=1)
    attrs = study.trials[0].system_attrs
    assert "grid_id" in attrs and "search_space" in attrs, f"GridSampler's system attributes changed: {attrs}"


# --- Hydra's JobReturn ----------------------------------------------------------------------------------


def test_job_return_value_gives_the_value_or_the_exception_unraised():
    from hydra.core.utils import JobReturn, JobStatus

    done = JobReturn(status=JobStatus.COMPLETED)
    done.return_value = 0.5
    assert upstream.job_return_value(done) == 0.5
    error = RuntimeError("task failed")
    failed = JobReturn(status=JobStatus.FAILED)
    failed.return_value = error
    assert upstream.job_return_value(failed) is error, "hydra.core.utils.JobReturn._return_value changed"


# --- torch -------------------------------------------------------------------------------------------


def test_cuda_runtime_device_count():
    """``torch._C._cuda_getDeviceCount`` (trial groups check their ``CUDA_VISIBLE_DEVICES`` took effect): -1 on
    a CPU build, else the CUDA runtime's count, which agrees with ``torch.cuda.device_count()``."""
    import torch

    count = upstream.cuda_runtime_device_count()
    if not torch.backends.cuda.is_built():
        assert count == -1
    else:
        assert hasattr(torch._C, "_cuda_getDeviceCount"), "torch moved _cuda_getDeviceCount"
        assert count == torch.cuda.device_count()


def test_asked_trial_frozen_holds_what_the_ask_read_and_what_the_trial_set(tmp_path):
    """A retry's copied attributes arrive with the asked trial (no second read of the storage)."""
    study = _study(tmp_path)
    study.enqueue_trial({"x": 0.5}, user_attrs={"copied": 1})
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("mine", 2)
    frozen = upstream.asked_trial_frozen(trial)
    assert frozen.number == trial.number, "Trial._cached_frozen_trial changed"
    assert frozen.user_attrs == {"copied": 1, "mine": 2}, "Trial._cached_frozen_trial no longer follows set_user_attr"
    assert frozen.params == {"x": 0.5}
