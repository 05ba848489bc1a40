"""Case C35: the storage connection drops during a sweep (optuna/optuna#5600).

A sweep runs on the test PostgreSQL server through a real TCP proxy (``tests/pg_outage.py``), in process at
world size 1 (``tests/in_process.py``): rank 0 alone talks to the storage, so what it retries, where it stops
and what it says are its own; how the other ranks leave when rank 0 stops is the agreed-failure contract's
(``tests/multirank``). The task's rank 0 (``tests/apps/storage_cut_app.py`` with ``tests/apps/pg_cut.py``) terminates the
sweeper's backends with ``pg_terminate_backend`` (only those tagged with this test's
``application_name``) and makes the proxy refuse new connections for a while: at set-up, inside
``ask``, before a ``report``, before the task returns (the tell and the next ask meet it), and before
the results are written; the heartbeat thread beats through the same outages.

PostgreSQL: ``DSO_TEST_POSTGRES_URL`` (fixture of ``test_shared_study.py``; fails when no server answers,
skipped only with ``DSO_SKIP_POSTGRES=1``). Each test uses its own study, deleted at the end.
Timeouts are layered: the storage retry budget (<= rank_timeout / 2) < ``rank_timeout`` (30 s) < pytest's
timeout. The hooks at set-up, ask and results are installed with ``monkeypatch`` (undone after each test).
"""

from __future__ import annotations

import json
import re
import uuid

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from tests.in_process import APPS, run_app
from tests.multirank.test_shared_study import postgres_url  # noqa: F401 - the fixture
from tests.pg_outage import PgProxy, tear_down
#: Seconds the proxy refuses connections after each cut (a PostgreSQL restart takes about that long).
OUTAGE_S = 1.5


class CutSweep:
    """A sweep of the cut app through the proxy, and where to read what happened."""

    def __init__(self, postgres_url: str, tmp_path, monkeypatch) -> None:
        real = sqlalchemy.engine.make_url(postgres_url)
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self.tag = f"dso_c35_{uuid.uuid4().hex[:10]}"
        self.study_name = f"dso-c35-{uuid.uuid4().hex[:10]}"
        self.direct = postgres_url
        self.proxy = PgProxy(real.host or "127.0.0.1", real.port or 5432, tmp_path / "pg_down")
        self.url = real.set(host="127.0.0.1", port=self.proxy.port, password="secret",
                            query={"application_name": self.tag}).render_as_string(hide_password=False)
        self.redacted = f"postgresql://postgres:***@127.0.0.1:{self.proxy.port}/test?application_name={self.tag}"
        self.env = {
            "DSO_PG_DOWN_FILE": str(self.proxy.down_file),
            "DSO_PG_ADMIN_URL": real.set(drivername="postgresql").render_as_string(hide_password=False),
            "DSO_PG_APP_NAME": self.tag,
            "DSO_C35_CUT_LOG": str(tmp_path / "cuts.jsonl"),
            "DSO_C35_OUTAGE_S": str(OUTAGE_S),
        }

    def run(self, *overrides: str, cuts: str, env=None):
        """``python storage_cut_app.py -m ...`` in process, cutting at ``cuts`` (the set-up, ask and results
        hooks installed for this run only)."""
        import pg_cut  # tests/apps/pg_cut.py (tests/apps is on sys.path: the fixture)
        import storage_cut_app  # noqa: F401  imported before the switches are set: its own import-time hooks stay off

        args = ["-m", f"hydra.sweep.dir={self.tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30",
                f"hydra.sweeper.storage='{self.url}'", f"hydra.sweeper.study_name={self.study_name}",
                "hydra.sweeper.plots=false", "x=interval(-1,1)", "steps=3", "sleep_s=0.5", *overrides]
        extra = {**self.env, "DSO_C35_CUTS": cuts, **(env or {})}
        with self.monkeypatch.context() as patch:
            for name, value in extra.items():
                patch.setenv(name, value)
            patch.delenv("RANK", raising=False)
            pg_cut.install_hooks(patch.setattr)
            return run_app("storage_cut_app", args, config_name="app", env=extra)

    def cuts(self) -> list[dict]:
        path = self.tmp_path / "cuts.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name=self.study_name, storage=self.direct).trials


@pytest.fixture
def cut_sweep(postgres_url, tmp_path, monkeypatch):  # noqa: F811
    import sys

    if str(APPS) not in sys.path:
        monkeypatch.syspath_prepend(str(APPS))
    sweep = CutSweep(postgres_url, tmp_path, monkeypatch)
    yield sweep
    tear_down(sweep.proxy, sweep.study_name, postgres_url)


def _assert_complete_with_values(trials, n: int) -> None:
    """``n`` trials, each COMPLETE with value x**2 and intermediate values x**2 + step at steps 0..2."""
    assert len(trials) == n, [(t.number, t.state) for t in trials]
    for t in trials:
        x2 = t.params["x"] ** 2
        assert t.state == TrialState.COMPLETE, (t.number, t.state, t.user_attrs)
        assert t.value == pytest.approx(x2)
        assert t.intermediate_values == {s: pytest.approx(x2 + s) for s in range(3)}, t.number


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_c35_cuts_during_a_sweep_lose_nothing_and_fail_no_trial(cut_sweep):
    """Every cut (terminated backends + 1.5 s without connections) is retried: exit 0,
    n_trials COMPLETE trials with their values and intermediate values, the warm start run once. One sweep
    meets every cut point: set-up once, then in each of the 3 trials the ask, a report and the task's end
    (the tell and the next ask), and the results once."""
    cuts = "setup,ask,report,end,results"
    res = cut_sweep.run("hydra.sweeper.n_trials=3", "hydra.sweeper.heartbeat_interval=1",
                        "hydra.sweeper.grace_period=20", "hydra.sweeper.enqueue_trials=[{x:0.5}]", cuts=cuts)
    res.check()
    trials = cut_sweep.trials()
    _assert_complete_with_values(trials, 3)
    assert trials[0].params == {"x": 0.5}
    labels = [c["label"].split()[0] for c in cut_sweep.cuts()]
    expected = {"setup": 1, "ask": 3, "report": 3, "end": 3, "results": 1}
    assert {k: labels.count(k) for k in expected} == expected, labels
    assert sum(c["terminated"] for c in cut_sweep.cuts()) >= len(labels), cut_sweep.cuts()  # real cuts
    assert cut_sweep.proxy.refused >= len(labels), "a cut was never met by the sweeper"
    assert "retrying on a fresh connection" in res.output and "answers again" in res.output
    # the heartbeat thread (every 1 s) met the 1.5 s outages of the reports too, and carried on
    assert "Heartbeat of trial id" in res.output
    assert (cut_sweep.tmp_path / "sweep" / "optimization_results.yaml").exists()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_c35_an_outage_beyond_the_budget_stops_naming_the_storage_and_resumes(cut_sweep):
    """The server goes away for good in trial 1's report: after hydra.sweeper.storage_retry_timeout
    (4 s) the sweep stops with the storage named (password hidden) and the resume command on its
    own line; trial 0 and trial 1's first report stay stored; the same command, once the server is
    back, finishes the study."""
    common = ("hydra.sweeper.n_trials=3", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=2",
              "hydra.sweeper.retry_failed_trials=1", "hydra.sweeper.storage_retry_timeout=4")
    res = cut_sweep.run(*common, cuts="report", env={"DSO_C35_FROM_TRIAL": "1", "DSO_C35_OUTAGE_S": "3600"})
    assert res.returncode == 1, res.output[-6000:]
    assert f"the Optuna storage '{cut_sweep.redacted}' kept failing for" in res.output, res.output[-6000:]
    # the password only where the user typed it: the command lines that repeat the user's arguments
    assert "secret" not in "\n".join(ln for ln in res.output.splitlines() if "storage_cut_app.py" not in ln)
    line = re.search(r"resume the study with:\n(.*)\n", res.output)
    assert line and line.group(1).endswith(f"hydra.sweep.dir={cut_sweep.tmp_path / 'sweep'}"), res.output[-6000:]
    assert "storage_cut_app.py" in line.group(1)
    assert "failure rate" not in res.output  # the outage is named, not the trial it broke
    cut_sweep.proxy.up()
    first = cut_sweep.trials()
    assert [t.state for t in first] == [TrialState.COMPLETE, TrialState.RUNNING]
    _assert_complete_with_values(first[:1], 1)
    assert first[1].intermediate_values == {0: pytest.approx(first[1].params["x"] ** 2)}

    res = cut_sweep.run(*common, cuts="")
    res.check()
    trials = cut_sweep.trials()
    assert trials[0] == first[0] or (trials[0].values, trials[0].intermediate_values) == (
        first[0].values, first[0].intermediate_values)
    assert trials[1].state == TrialState.FAIL and trials[1].intermediate_values == first[1].intermediate_values
    assert trials[2].params == first[1].params  # trial 1 re-queued with its params (retry_failed_trials=1)
    _assert_complete_with_values([t for t in trials if t.number != 1], 3)
