"""Case C35 in one process: storage calls survive dropped connections, outages and lost answers.

Real parts only: the test PostgreSQL server (``DSO_TEST_POSTGRES_URL``, fixture shared with
``tests/multirank/test_shared_study.py``) behind a real TCP proxy (``tests/pg_outage.py``) that refuses
connections for a while or loses a COMMIT's answer, ``pg_terminate_backend`` on the connections
tagged with this test's ``application_name``, real SQLite locks, and the storage as the sweeper
opens it (``_storage.open_storage``). The sweeps with cuts are in ``tests/test_storage_outage.py``.
"""

from __future__ import annotations

import inspect
import sqlite3
import threading
import time
import uuid

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study import _storage
from tests.multirank.test_shared_study import postgres_url  # noqa: F401 - the fixture
from tests.pg_outage import PgProxy, down, tear_down, terminate_tagged

pytestmark = pytest.mark.timeout(120)


def _open(url: str, retry_s: float):
    """The storage as the sweeper opens it (no heartbeat), with a retry budget of ``retry_s`` seconds."""
    kwargs = {"retry_timeout_s": retry_s} if "retry_timeout_s" in inspect.signature(_storage.open_storage).parameters \
        else {}
    return _storage.open_storage(url, heartbeat_interval_s=None, grace_period_s=None, max_retry=0, **kwargs)


class Outage:
    """The proxied URL (password ``secret``, tagged), the admin URL, and cut/down helpers."""

    def __init__(self, postgres_url: str, tmp_path) -> None:
        real = sqlalchemy.engine.make_url(postgres_url)
        self.tag = f"dso_c35_{uuid.uuid4().hex[:10]}"
        self.admin = real.set(drivername="postgresql").render_as_string(hide_password=False)
        self.direct = postgres_url
        self.proxy = PgProxy(real.host or "127.0.0.1", real.port or 5432, tmp_path / "pg_down")
        self.url = real.set(host="127.0.0.1", port=self.proxy.port, password="secret",
                            query={"application_name": self.tag}).render_as_string(hide_password=False)
        self.study_name = f"dso-c35-{uuid.uuid4().hex[:10]}"

    def cut(self, outage_s: float) -> int:
        """Refuse new connections for ``outage_s`` s and terminate the tagged backends; returns how many."""
        down(self.proxy.down_file, outage_s)
        return terminate_tagged(self.admin, self.tag)


@pytest.fixture
def outage(postgres_url, tmp_path):  # noqa: F811
    o = Outage(postgres_url, tmp_path)
    yield o
    tear_down(o.proxy, o.study_name, postgres_url)


# --- which errors are transient: real errors from real databases ------------------------------------


def _error(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("expected an error")


def test_transient_errors_are_told_apart_with_real_errors(postgres_url, tmp_path):  # noqa: F811
    from hydra_plugins.ds_optuna_sweeper._study._storage_text import is_transient

    tag = f"dso_c35_{uuid.uuid4().hex[:10]}"
    url = sqlalchemy.engine.make_url(postgres_url).update_query_dict({"application_name": tag})
    engine = sqlalchemy.create_engine(url)  # no pre-ping: the dead connection is met by the query
    admin = sqlalchemy.engine.make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT 1"))
        assert terminate_tagged(admin, tag) == 1
        terminated = _error(lambda: conn.execute(sqlalchemy.text("SELECT 1")))
    refused = _error(lambda: sqlalchemy.create_engine("postgresql://nobody@127.0.0.1:1/none").connect())
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("CREATE TEMP TABLE c35 (k int PRIMARY KEY)"))
        conn.execute(sqlalchemy.text("INSERT INTO c35 VALUES (1)"))
        duplicate = _error(lambda: conn.execute(sqlalchemy.text("INSERT INTO c35 VALUES (1)")))
        conn.rollback()
        missing_table = _error(lambda: conn.execute(sqlalchemy.text("SELECT * FROM c35_no_such_table")))
    engine.dispose()
    no_database = _error(lambda: sqlalchemy.create_engine(
        sqlalchemy.engine.make_url(postgres_url).set(database="dso_c35_no_such_db")).connect())

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (k int)")
    holder.execute("BEGIN EXCLUSIVE")
    sqlite_engine = sqlalchemy.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    locked = _error(lambda: sqlite_engine.connect().execute(sqlalchemy.text("SELECT * FROM t")))
    holder.execute("COMMIT")
    no_sqlite_table = _error(lambda: sqlite_engine.connect().execute(sqlalchemy.text("SELECT * FROM none_here")))
    holder.close()
    sqlite_engine.dispose()

    # Optuna wraps SQLAlchemy's errors raised at commit in its StorageInternalError: the cause decides.
    try:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from terminated
    except optuna.exceptions.StorageInternalError as e:
        wrapped = e

    verdicts = {name: is_transient(e) for name, e in {
        "pg_terminate_backend": terminated, "connection refused": refused, "wrapped by Optuna": wrapped,
        "sqlite database is locked": locked, "duplicate key": duplicate, "missing table": missing_table,
        "no such database": no_database, "sqlite missing table": no_sqlite_table,
        "ValueError": ValueError("x"), "KeyError": KeyError("x"),
        "finished trial": optuna.exceptions.UpdateFinishedTrialError("Trial#0 has already finished"),
    }.items()}
    assert verdicts == {
        "pg_terminate_backend": True, "connection refused": True, "wrapped by Optuna": True,
        "sqlite database is locked": True, "duplicate key": False, "missing table": False,
        "no such database": False, "sqlite missing table": False, "ValueError": False, "KeyError": False,
        "finished trial": False,
    }, verdicts


def test_every_transaction_of_rdbstorage_has_a_retry_rule():
    """Each RDBStorage method that opens a session is retried, retried after a check, or named as not
    retried; a method Optuna adds (or renames) fails here instead of going unprotected."""
    from optuna.storages import RDBStorage

    from hydra_plugins.ds_optuna_sweeper._study import _retry

    opening = sorted(n for n, f in inspect.getmembers(RDBStorage, inspect.isfunction)
                     if "_create_scoped_session(" in inspect.getsource(f) and n != "_create_scoped_session")
    ruled = set(_retry.IDEMPOTENT) | set(_retry.CHECKED) | set(_retry.NOT_RETRIED)
    assert sorted(set(opening) - ruled) == []
    for name in (*_retry.IDEMPOTENT, *_retry.CHECKED, *_retry.DELEGATING):
        assert hasattr(RDBStorage, name), name
    for name in (*_retry.IDEMPOTENT, *_retry.CHECKED):
        assert getattr(_retry.RetryingRDBStorage, name) is not getattr(RDBStorage, name), name


# --- a study through cuts and outages ---------------------------------------------------------------


def test_ask_report_tell_and_reads_survive_cuts_with_outages(outage):
    storage = _open(outage.url, retry_s=30)
    study = optuna.create_study(storage=storage, study_name=outage.study_name)
    t0 = time.monotonic()
    trial = study.ask()
    assert outage.cut(1.0) >= 1
    trial.report(0.5, 0)  # report: the connection was terminated and the server refuses for 1 s
    outage.cut(1.0)
    assert not trial.should_prune()
    outage.cut(1.0)
    study.tell(trial, 0.25)
    outage.cut(1.0)
    second = study.ask()  # ask on a dead connection
    outage.cut(1.0)
    study.tell(second, 0.75)
    outage.cut(1.0)
    best = study.best_trial  # results writing reads
    assert outage.proxy.refused >= 5, "the outages were never met"
    stored = optuna.load_study(study_name=outage.study_name, storage=outage.direct)
    assert [(t.number, t.state, t.value, t.intermediate_values) for t in stored.trials] == [
        (0, TrialState.COMPLETE, 0.25, {0: 0.5}), (1, TrialState.COMPLETE, 0.75, {})]
    assert best.number == 0
    assert time.monotonic() - t0 >= 6 * 1.0 * 0.9


def test_set_up_survives_a_cut_between_create_and_load(outage):
    storage = _open(outage.url, retry_s=30)
    optuna.create_study(storage=storage, study_name=outage.study_name)
    outage.cut(1.5)
    study = optuna.load_study(storage=storage, study_name=outage.study_name)  # set-up of a resumed sweep
    study.set_user_attr("ds_optuna:runs", 1)
    assert optuna.load_study(study_name=outage.study_name, storage=outage.direct).user_attrs == {"ds_optuna:runs": 1}


def test_an_outage_beyond_the_budget_names_the_storage_and_keeps_what_was_stored(outage):
    storage = _open(outage.url, retry_s=3)
    study = optuna.create_study(storage=storage, study_name=outage.study_name)
    trial = study.ask()
    trial.report(0.5, 0)
    outage.cut(3600)
    t0 = time.monotonic()
    with pytest.raises(Exception) as raised:
        trial.report(0.25, 1)
    waited = time.monotonic() - t0
    from hydra_plugins.ds_optuna_sweeper import StorageUnavailableError

    assert isinstance(raised.value, StorageUnavailableError), repr(raised.value)
    text = str(raised.value)
    assert f"'postgresql://postgres:***@127.0.0.1:{outage.proxy.port}/test?application_name={outage.tag}'" in text
    assert "secret" not in text and "storage_retry_timeout" in text
    assert 3 <= waited < 15, waited
    t1 = time.monotonic()
    with pytest.raises(StorageUnavailableError):  # the budget is spent: the next call gives up at once
        study.tell(trial, 1.0)
    assert time.monotonic() - t1 < 3
    outage.proxy.up()
    stored = optuna.load_study(study_name=outage.study_name, storage=outage.direct).trials
    assert [(t.state, t.intermediate_values) for t in stored] == [(TrialState.RUNNING, {0: 0.5})]


def test_answers_lost_after_commit_never_duplicate_a_trial_nor_fail_a_tell(outage):
    """The server commits, the answer is lost: the call must not run twice (two trials, a FAIL tell)."""
    storage = _open(outage.url, retry_s=30)
    outage.proxy.lose_commit_answer(b"INSERT INTO studies ")
    study = optuna.create_study(storage=storage, study_name=outage.study_name)
    outage.proxy.lose_commit_answer(b"INSERT INTO trials ")
    trial = study.ask()
    outage.proxy.lose_commit_answer(b"UPDATE trials SET state")
    study.tell(trial, 0.5)
    study.enqueue_trial({"x": 0.1})
    outage.proxy.lose_commit_answer(b"UPDATE trials SET state")
    queued = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # takes the WAITING trial
    study.tell(queued, 0.1)
    assert outage.proxy.answers_lost == 4
    stored = optuna.load_study(study_name=outage.study_name, storage=outage.direct).trials
    assert [(t.number, t.state, t.value, t.params) for t in stored] == [
        (0, TrialState.COMPLETE, 0.5, {}), (1, TrialState.COMPLETE, 0.1, {"x": 0.1})]


def test_sqlite_locked_beyond_its_busy_timeout_is_retried(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = _open(url, retry_s=30)
    study = optuna.create_study(storage=storage, study_name="c35")
    trial = study.ask()
    holder = sqlite3.connect(tmp_path / "optuna.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the database for longer than SQLite's 5 s
    release = threading.Timer(6.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        trial.report(0.5, 0)
        study.tell(trial, 0.5)
    finally:
        release.join()
        holder.close()
    stored = optuna.load_study(study_name="c35", storage=url).trials
    assert [(t.state, t.value, t.intermediate_values) for t in stored] == [(TrialState.COMPLETE, 0.5, {0: 0.5})]


def test_retry_budget_is_capped_by_rank_timeout_and_checked():
    from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
    from hydra_plugins.ds_optuna_sweeper._settings import Settings

    base = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}
    default = Settings.from_node(base, world_size=1)
    assert (default.storage_retry_timeout_s, default.storage_retry_budget_s) == (120.0, 120.0)
    short = Settings.from_node({**base, "rank_timeout": 30, "storage_retry_timeout": 120}, world_size=1)
    assert short.storage_retry_budget_s == 15.0
    assert Settings.from_node({**base, "storage_retry_timeout": 0}, world_size=1).storage_retry_budget_s == 0.0
    with pytest.raises(SweeperConfigError, match="storage_retry_timeout must be >= 0"):
        Settings.from_node({**base, "storage_retry_timeout": -1}, world_size=1)


def test_a_postgresql_url_without_its_driver_names_the_extra(monkeypatch):
    """A new user's venv without the ``[postgres]`` extra: Optuna's "Failed to import DB access module" becomes an
    error that names the extra to install, the password masked."""
    import sys

    from hydra_plugins.ds_optuna_sweeper._study._storage import open_storage

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError, as when not installed
    with pytest.raises(ImportError, match=r"postgresql://u:\*\*\*@127.0.0.1:5432/test needs a PostgreSQL driver .*"
                                          r"pip install 'hydra-ds-optuna-sweeper\[postgres\]'"):
        open_storage("postgresql://u:secret@127.0.0.1:5432/test", heartbeat_interval_s=None, grace_period_s=None,
                     max_retry=0)
