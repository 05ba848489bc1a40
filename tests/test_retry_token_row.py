"""The creation token of an asked trial (case C35) costs one INSERT in the creating transaction (H8 overhead check).

``RetryingRDBStorage`` tags every new trial with :data:`_stored.TOKEN_ATTR`, so that a creation whose answer
was lost is found instead of repeated. Through Optuna's template path each attribute costs a SELECT of
the trial and an upsert; an asked trial (no template) now gets the same row added directly. Real SQLite
files, the storage as the sweeper opens it, SQLAlchemy's own statement events; no mocks.
"""

from __future__ import annotations

import json
import sqlite3

import optuna
import sqlalchemy

from hydra_plugins.ds_optuna_sweeper._study import _storage
from hydra_plugins.ds_optuna_sweeper._study._retry import RetryingRDBStorage, TOKEN_ATTR


def _open(path):
    storage = _storage.open_storage(f"sqlite:///{path}", heartbeat_interval_s=None, grace_period_s=None,
                                    max_retry=0, retry_timeout_s=30)
    assert isinstance(storage, RetryingRDBStorage)
    return storage


def _token_rows(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT trial_id, value_json FROM trial_system_attributes WHERE key = ?",
                          (TOKEN_ATTR,)).fetchall()


def _ask_statements(storage):
    """The SQL statements of the second ask of a new study on ``storage`` (the first warms the caches)."""
    study = optuna.create_study(storage=storage, study_name="s")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    study.tell(study.ask(dist), 0.1)
    statements: list[str] = []

    def note(conn, cursor, sql, *rest):
        statements.append(sql)

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", note)
    trial = study.ask(dist)
    sqlalchemy.event.remove(storage.engine, "before_cursor_execute", note)
    return study, trial, statements


def test_an_asked_trial_stores_its_token_in_one_insert_and_reads_it_back(tmp_path):
    plain = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'plain.db'}")
    _, _, plain_statements = _ask_statements(plain)
    storage = _open(tmp_path / "s.db")
    study, trial, statements = _ask_statements(storage)
    extra = list(statements)
    for sql in plain_statements:
        if sql in extra:
            extra.remove(sql)
    assert len(statements) == len(plain_statements) + 1, extra
    assert len(extra) == 1 and extra[0].startswith("INSERT INTO trial_system_attributes"), extra
    stored = storage.get_trial(trial._trial_id).system_attrs
    assert len(stored[TOKEN_ATTR]) == 32
    assert (trial._trial_id, json.dumps(stored[TOKEN_ATTR])) in _token_rows(tmp_path / "s.db")
    study.tell(trial, 0.5)
    assert study.trials[-1].state == optuna.trial.TrialState.COMPLETE


def test_a_trial_made_from_a_template_keeps_its_attributes_and_a_token(tmp_path):
    storage = _open(tmp_path / "s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 0.25}, user_attrs={"why": "warm start"})
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    assert trial.params == {"x": 0.25}
    frozen = storage.get_trial(trial._trial_id)
    assert frozen.user_attrs == {"why": "warm start"}
    assert TOKEN_ATTR in frozen.system_attrs and "fixed_params" in frozen.system_attrs
    assert len(_token_rows(tmp_path / "s.db")) == 1
