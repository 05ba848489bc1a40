"""``Settings.storage_url`` is a URL or ``None``; ``Settings.storage_label`` is the text messages show.

Tables for ``_settings.py`` (issue 39 item 4: rows that kill its mutants).

Each ``hydra.sweeper`` key lands in its :class:`Settings` field (the schema ``config.DSOptunaSweeperConf`` gives
the defaults: 20 trials, 1 job, rank_timeout 600 s, heartbeat 60 s, storage retry 120 s, keep_best 1, preempt
grace 15 s, refit of the best trial); the derived properties follow their docstrings.
"""

import pytest
from hydra_plugins.ds_optuna_sweeper._settings import Settings
from omegaconf import OmegaConf
from hydra_plugins.ds_optuna_sweeper._settings import StopRules


def _settings(storage):
    return Settings.from_node({"sampler": {"_target_": "optuna.samplers.TPESampler"},
                               "pruner": {"_target_": "optuna.pruners.NopPruner"}, "storage": storage}, world_size=1)


def test_default_storage_is_the_sqlite_file_in_the_sweep_dir():
    s = _settings(None)
    assert not s.storage_is_node
    assert s.storage_url("/x") == s.storage_label("/x") == "sqlite:////x/optuna.db"


def test_a_configured_url_is_its_own_label():
    s = _settings("sqlite:///a.db")
    assert s.storage_url("/x") == s.storage_label("/x") == "sqlite:///a.db"


def test_a_target_node_has_no_url_and_a_text_label():
    s = _settings({"_target_": "optuna.storages.InMemoryStorage"})
    assert s.storage_is_node
    assert s.storage_url("/x") is None
    assert "optuna.storages.InMemoryStorage" in s.storage_label("/x")


def test_the_storage_error_says_how_to_write_each_kind():
    """Case C56: the hint named only sqlite/postgresql URLs; now each URL form and the ``_target_`` form."""
    from hydra_plugins.ds_optuna_sweeper._study._study import storage_error

    text = str(storage_error("redis://:pw@h:6379/0", "s", AttributeError("no create_new_study")))
    for form in ("sqlite:///", "postgresql://", "redis://host:6379/0", "optuna.storages.JournalStorage",
                 "JournalFileBackend", "JournalRedisBackend", "is wrapped in JournalStorage"):
        assert form in text, form
    assert "pw" not in text  # the Redis password is hidden like a database's


def test_a_redis_url_and_a_bare_journal_backend_become_a_journal_storage(tmp_path):
    """Case C56, without a server: a journal backend alone is wrapped in ``JournalStorage``; a Redis URL is
    recognised as one (``open_storage`` then opens ``JournalStorage(JournalRedisBackend(url))``)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from hydra_plugins.ds_optuna_sweeper._study import _storage, _storage_text as _urls

    backend = JournalFileBackend(str(tmp_path / "j.log"))
    wrapped = _storage.journal_storage(backend)
    assert isinstance(wrapped, optuna.storages.JournalStorage)
    assert optuna.create_study(storage=wrapped, study_name="s").study_name == "s"
    assert _storage.journal_storage("sqlite:///x.db") == "sqlite:///x.db"
    assert _urls.is_redis_url("redis://h:6379/4") and _urls.is_redis_url("rediss://h/0")
    assert not _urls.is_redis_url("sqlite:///redis.db")
    assert _urls.redact_url("redis://u:secret@h:6379/4") == "redis://u:***@h:6379/4"


def test_a_redis_url_nobody_answers_fails_at_once():
    """Another input of C56's kind: a Redis URL with no server; the first command fails at once (the caller
    words it with the hint above), not at the first trial."""
    import time

    import pytest

    redis = pytest.importorskip("redis", reason="the 'redis' extra is not installed")
    from hydra_plugins.ds_optuna_sweeper._study import _storage

    t0 = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        _storage.open_storage("redis://127.0.0.1:1/0", heartbeat_interval_s=None, grace_period_s=None, max_retry=0)
    assert time.monotonic() - t0 < 10


BASE = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}

EVERY_KEY = {
    "sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 3}, "pruner": {"_target_": "optuna.pruners.NopPruner"},
    "direction": ["maximize", "minimize"], "storage": "sqlite:///x.db", "study_name": "st", "n_trials": 7, "n_jobs": 2,
    "timeout": 30.5, "max_failure_rate": 0.25, "params": {"lr": "interval(0,1)"}, "custom_search_space": "m.f",
    "enqueue_trials": [{"lr": 0.5}], "plots": False, "plot_every": 3, "repeats": 2, "seed_key": "seed",
    "seeds": [5, 6], "rank_timeout": 300.0, "retry_failed_trials": 2, "heartbeat_interval": 20, "grace_period": 90,
    "storage_retry_timeout": 100.0, "allow_search_space_change": True, "backend": "gloo",
    "refit": {"enabled": True, "overrides": ["epochs=5"], "trials": ["enqueued", 3],
              "baselines": {"base": {"lr": 0.1}, "plain": {}}, "from_checkpoint": True},
    "checkpoints": {"dir": "/ck", "keep_best": 2, "keep_pruned": True, "preempt_grace": 20.0},
}

EXPECTED_EVERY_KEY = {
    "directions": ("maximize", "minimize"), "storage": "sqlite:///x.db", "study_name": "st", "n_trials": 7,
    "n_jobs": 2, "timeout_s": 30.5, "max_failure_rate": 0.25, "custom_search_space": "m.f",
    "enqueue_trials": ({"lr": 0.5},), "plots": False, "plot_every": 3, "repeats": 2, "seed_key": "seed",
    "seeds": (5, 6), "rank_timeout_s": 300.0, "retry_failed_trials": 2, "heartbeat_interval_s": 20,
    "grace_period_s": 90, "allow_search_space_change": True, "backend": "gloo", "refit_enabled": True,
    "refit_overrides": ("epochs=5",), "refit_trials": ("enqueued", 3),
    "refit_baselines": (("base", ("lr=0.1",)), ("plain", ())), "storage_retry_timeout_s": 100.0,
    "checkpoint_root": "/ck", "keep_best": 2, "keep_pruned": True, "preempt_grace_s": 20.0,
    "refit_from_checkpoint": True, "world_size": 2, "stop": StopRules(),
}

EXPECTED_DEFAULTS = {
    "directions": ("minimize",), "storage": None, "study_name": None, "n_trials": 20, "n_jobs": 1, "timeout_s": None,
    "max_failure_rate": 0.0, "params": None, "custom_search_space": None, "enqueue_trials": (), "plots": True,
    "plot_every": 0, "repeats": 1, "seed_key": None, "seeds": (0,), "rank_timeout_s": 600.0, "retry_failed_trials": 0,
    "heartbeat_interval_s": 60, "grace_period_s": None, "allow_search_space_change": False, "backend": None,
    "refit_enabled": False, "refit_overrides": (), "refit_trials": ("best",), "refit_baselines": (),
    "storage_retry_timeout_s": 120.0, "checkpoint_root": None, "keep_best": 1, "keep_pruned": False,
    "preempt_grace_s": 15.0, "refit_from_checkpoint": False, "world_size": 1, "stop": StopRules(),
}


@pytest.mark.parametrize("node, world_size, expected", [
    (EVERY_KEY, 2, EXPECTED_EVERY_KEY),
    (BASE, 1, EXPECTED_DEFAULTS),
], ids=["every key set", "defaults"])
def test_each_key_lands_in_its_field(node, world_size, expected):
    s = Settings.from_node(node, world_size=world_size)
    got = {name: getattr(s, name) for name in expected}
    assert got == expected
    assert {name: type(value) for name, value in got.items()} == {name: type(v) for name, v in expected.items()}
    assert OmegaConf.to_container(s.sampler) == node["sampler"] and OmegaConf.to_container(s.pruner) == node["pruner"]
    assert (OmegaConf.to_container(s.params) if s.params is not None else None) == node.get("params")
    assert s.tracking.report_to == ()


def test_stop_and_tracking_nodes_are_read():
    s = Settings.from_node({**BASE, "stop": {"goal": 0.1, "patience": 3}, "direction": "maximize",
                            "tracking": {"report_to": ["tensorboard"]}}, world_size=1)
    assert s.stop == StopRules(goal=0.1, patience=3, terminator=None)
    assert s.tracking.report_to == ("tensorboard",)


@pytest.mark.parametrize("n_jobs, world_size, trial_groups, batch", [
    (1, 1, 1, 1), (3, 1, 1, 3), (2, 2, 2, 1), (1, 4, 1, 1), (4, 8, 4, 1),
])
def test_trial_groups_and_batch(n_jobs, world_size, trial_groups, batch):
    s = Settings.from_node({**BASE, "n_jobs": n_jobs}, world_size=world_size)
    assert (s.trial_groups, s.batch) == (trial_groups, batch)


@pytest.mark.parametrize("direction, n", [("minimize", 1), (["maximize"], 1), (["minimize", "maximize", "minimize"], 3)])
def test_n_objectives(direction, n):
    assert Settings.from_node({**BASE, "direction": direction}, world_size=1).n_objectives == n


@pytest.mark.parametrize("retry, rank_timeout, budget", [
    (120.0, 600.0, 120.0), (120.0, 200.0, 100.0), (50.0, 100.0, 50.0), (0.0, 600.0, 0.0),
])
def test_storage_retry_budget_is_at_most_half_the_rank_timeout(retry, rank_timeout, budget):
    s = Settings.from_node({**BASE, "storage_retry_timeout": retry, "rank_timeout": rank_timeout}, world_size=1)
    assert s.storage_retry_budget_s == budget


@pytest.mark.parametrize("storage, is_node, url, label", [
    (None, False, "sqlite:////sw/optuna.db", "sqlite:////sw/optuna.db"),
    ("postgresql://u@h/db", False, "postgresql://u@h/db", "postgresql://u@h/db"),
    ({"_target_": "optuna.storages.InMemoryStorage"}, True, None, "{'_target_': 'optuna.storages.InMemoryStorage'}"),
])
def test_storage_url_and_label(storage, is_node, url, label):
    s = Settings.from_node({**BASE, "storage": storage}, world_size=1)
    assert (s.storage_is_node, s.storage_url("/sw"), s.storage_label("/sw")) == (is_node, url, label)


def test_the_stop_rules_are_checked_against_the_directions():
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError

    with pytest.raises(SweeperConfigError) as err:
        Settings.from_node({**BASE, "stop": {"goal": 0.1}, "direction": ["minimize", "maximize"]}, world_size=1)
    assert str(err.value) == ("hydra.sweeper.stop (goal=0.1) needs a single objective; the study has 2 directions "
                              "['minimize', 'maximize']. Use n_trials or timeout to bound it.")


def test_the_budget_is_checked_against_the_world():
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError

    assert Settings.from_node({**BASE, "n_jobs": 2}, world_size=4, local_world_size=2).n_jobs == 2
    with pytest.raises(SweeperConfigError, match=r"^hydra.sweeper.n_jobs=3 does not divide the torchrun world of 4 "):
        Settings.from_node({**BASE, "n_jobs": 3}, world_size=4, local_world_size=2)


def test_the_budget_is_checked_against_the_nodes():
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError

    assert Settings.from_node({**BASE, "n_jobs": 3}, world_size=6).n_jobs == 3  # one node of 6 ranks
    with pytest.raises(SweeperConfigError) as err:
        Settings.from_node({**BASE, "n_jobs": 3}, world_size=6, local_world_size=3)
    assert str(err.value) == (
        "hydra.sweeper.n_jobs=3 makes trial groups of 2 ranks, which would straddle nodes of 3 ranks unevenly (a "
        "group must fit in one node or be made of whole nodes); use one of: 1 (6 ranks a trial), 2 (3 ranks a "
        "trial), 6 (1 rank a trial). Nothing was started.")


@pytest.mark.parametrize("keys, message", [
    ({"backend": "nope"}, "hydra.sweeper.backend='nope': unknown torch.distributed backend ['nope']; use one of "),
    ({"sampler": {"_target_": "optuna.samplers.TPESampler", "n_startup_trial": 5}},
     "hydra.sweeper.sampler has key(s) ['n_startup_trial'] that optuna.samplers.TPESampler does not take (its "
     "arguments: consider_prior, prior_weight, consider_magic_clip, consider_endpoints, n_startup_trials, "
     "n_ei_candidates, gamma, weights, seed, multivariate, group, warn_independent_sampling, constant_liar, "
     "constraints_func): a key added to hydra.sweeper.sampler, or the keys of another hydra/sweeper/sampler option "
     "kept when _target_ was changed. Choose the class with hydra/sweeper/sampler=tpe (its keys then follow), not "
     "with sampler._target_, and set only its own keys. Nothing was run."),
    ({"pruner": {"_target_": "optuna.pruners.MedianPruner", "n_startup_trial": 5}},
     "hydra.sweeper.pruner has key(s) ['n_startup_trial'] that optuna.pruners.MedianPruner does not take (its "
     "arguments: n_startup_trials, n_warmup_steps, interval_steps, n_min_trials): a key added to "
     "hydra.sweeper.pruner, or the keys of another hydra/sweeper/pruner option kept when _target_ was changed. "
     "Choose the class with hydra/sweeper/pruner=median (its keys then follow), not with pruner._target_, and set "
     "only its own keys. Nothing was run."),
])
def test_each_node_is_checked(keys, message):
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError

    with pytest.raises(SweeperConfigError) as err:
        Settings.from_node({**BASE, **keys}, world_size=1)
    # the backend's list of names is torch's (tests/test_setting_values.py): only its start here
    assert str(err.value) == message if message.endswith("run.") else str(err.value).startswith(message)


def test_the_samplers_packages_are_checked(monkeypatch):
    from hydra_plugins.ds_optuna_sweeper import _setting_keys
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError

    monkeypatch.setitem(_setting_keys.SAMPLER_NEEDS, "optuna.samplers.TPESampler", ("no_such_package_l5",))
    with pytest.raises(SweeperConfigError, match=r"^hydra.sweeper.sampler optuna.samplers.TPESampler needs the Python "
                                                 r"package\(s\) no_such_package_l5, "):
        Settings.from_node(BASE, world_size=1)
