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

    from hydra_plugins.ds_optuna_sweeper._study import _storage

    backend = JournalFileBackend(str(tmp_path / "j.log"))
    wrapped = _storage.journal_storage(backend)
    assert isinstance(wrapped, optuna.storages.JournalStorage)
    assert optuna.create_study(storage=wrapped, study_name="s").study_name == "s"
    assert _storage.journal_storage("sqlite:///x.db") == "sqlite:///x.db"
    assert _storage.is_redis_url("redis://h:6379/4") and _storage.is_redis_url("rediss://h/0")
    assert not _storage.is_redis_url("sqlite:///redis.db")
    assert _storage.redact_url("redis://u:secret@h:6379/4") == "redis://u:***@h:6379/4"


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
