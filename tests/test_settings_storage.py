"""``Settings.storage_url`` is a URL or ``None``; ``Settings.storage_label`` is the text messages show."""

from hydra_plugins.ds_optuna_sweeper._settings import Settings


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
