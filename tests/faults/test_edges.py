"""The edges of a sweep (issue 12, cases C17-C30): concurrent start, group identity, resume, heartbeats,
bad input and misuse inside the task, each against real torchrun processes and a real storage.

Start-up races are repeated ``DSO_RACE_REPEATS`` times (default 1 in the suite; the issue's 20 in a
row were run with ``DSO_RACE_REPEATS=20``, see the README's Tests section), each on a storage that
starts empty: a new SQLite file, or a new PostgreSQL database.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._stored import ENQUEUED_ATTR, GROUP_ATTR, RUNS_ATTR
from hydra_plugins.ds_optuna_sweeper._study._study import run_seed
from tests.multirank.sweep_helpers import APP, LINGER, exit_env, exit_lines, exit_statuses, load, run_sweep
from tests.multirank.test_shared_study import postgres_url  # noqa: F401  (fixture: loud when no server)
from tests.torchrun_utils import REPO, base_env, kill_tree, run_command, run_python, run_torchrun, start_process, wait_process

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

EDGE_APP = "tests/apps/edge_app.py"
REPEATS = int(os.environ.get("DSO_RACE_REPEATS", "1"))
WARM = "hydra.sweeper.enqueue_trials=[{x:0.25}]"


def _edge(tmp_path: Path, *overrides: str, nproc: int = 2, timeout_s: float = 150, env: dict | None = None):
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    extra = {"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path), **(env or {})}
    if nproc == 1:
        return run_python(EDGE_APP, args, timeout_s=timeout_s, extra_env=extra)
    return run_torchrun(EDGE_APP, args, nproc=nproc, timeout_s=timeout_s, extra_env=extra)


def _edge_study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="edge_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


# --- C17, C29, C30: groups started together -----------------------------------------------------------


def _group_cmd(kind: str, storage: str, sweep_dir: Path, n_trials: int, *extra: str) -> list[str]:
    """``single``: one rank launched the way most people do (c10d on a free port, no --rdzv-id, so
    TORCHELASTIC_RUN_ID is 'none'); ``pair``: two ranks, --standalone."""
    if kind == "single":
        launch = ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
    else:
        launch = ["--standalone", "--nproc-per-node", "2"]
    return [sys.executable, "-m", "torch.distributed.run", *launch, str(REPO / APP), "-m",
            f"hydra.sweep.dir={sweep_dir}", f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=race",
            f"hydra.sweeper.n_trials={n_trials}", "hydra.sweeper.rank_timeout=60", "hydra.sweeper.plots=false",
            "x=interval(-1,1)", "hydra.sweeper.enqueue_trials=[{x:0.5}]", *extra]


def _start_groups(tmp_path: Path, storage: str, kinds: list[str], n_trials: int, delays: list[float] | None = None,
                  extra: tuple[str, ...] = ()):
    groups = []
    for i, kind in enumerate(kinds):
        if delays and delays[i]:
            time.sleep(delays[i])
        log = tmp_path / f"group{i}.log"
        with open(log, "w") as f:
            proc = start_process(_group_cmd(kind, storage, tmp_path / f"sweep{i}", n_trials, *extra), cwd=tmp_path,
                                 env=base_env(DSO_RECORD_DIR=str(tmp_path / f"records{i}")), stdout=f)
        groups.append((proc, log))
    return groups


def _wait_groups(groups, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    try:
        rcs = [wait_process(p, max(5.0, deadline - time.monotonic())) for p, _ in groups]
    finally:
        for p, _ in groups:
            kill_tree(p)
    bad = [(i, rc) for i, rc in enumerate(rcs) if rc != 0]
    assert not bad, "\n".join(f"--- group {i} exit {rc} ---\n{groups[i][1].read_text()[-5000:]}" for i, rc in bad)
    return rcs


def _assert_race_study(study: optuna.Study, n_trials: int, n_groups: int) -> None:
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert TrialState.FAIL not in states and TrialState.RUNNING not in states, states
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert n_trials <= len(complete) <= n_trials + n_groups - 1, states
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    enqueued = [t for t in trials if t.user_attrs.get(ENQUEUED_ATTR)]
    assert len(enqueued) == 1 and enqueued[0].params == {"x": 0.5}, [(t.number, t.params) for t in enqueued]  # C30
    assert study.user_attrs[RUNS_ATTR] == n_groups  # every group opened the study exactly once


@pytest.fixture
def new_pg_database(postgres_url):  # noqa: F811
    """A factory of new, empty PostgreSQL databases on the test server; all dropped afterwards."""
    import sqlalchemy

    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)
    made = []

    def make() -> str:
        name = f"dso_race_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        return sqlalchemy.engine.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.mark.timeout(240 * REPEATS + 60)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_c17_c30_groups_started_together_on_a_new_storage(tmp_path, backend, request, fault_record):
    # 3 single-rank groups and 2 groups of 2 ranks, started within ~100 ms, on a storage with no
    # tables yet: every group exits 0, 6+ trials COMPLETE, the warm start runs once.
    make_pg = request.getfixturevalue("new_pg_database") if backend == "postgres" else None
    kinds = ["single", "single", "single", "pair", "pair"]
    t0 = time.monotonic()
    for repeat in range(REPEATS):
        where = tmp_path / f"r{repeat}"
        where.mkdir()
        storage = make_pg() if make_pg else f"sqlite:///{where / 'shared' / 'race.db'}"
        (where / "shared").mkdir()
        groups = _start_groups(where, storage, kinds, n_trials=6)
        _wait_groups(groups, timeout_s=230)
        _assert_race_study(optuna.load_study(study_name="race", storage=storage), 6, len(kinds))
    print(f"\n{backend}: {REPEATS} start-up race(s) of {len(kinds)} groups passed in {time.monotonic() - t0:.0f} s")
    fault_record(f"C17/C30 {backend}: 5 groups started together on a new storage, {REPEATS} time(s): all exit 0, warm start once")


@pytest.mark.timeout(240 * REPEATS + 60)
def test_c29_a_late_group_never_closes_a_live_groups_trial(tmp_path, fault_record):
    # Three single-rank groups launched without --rdzv-id (TORCHELASTIC_RUN_ID=none in each), the
    # third a few seconds later while the others' trials run: nobody's trial is failed by another.
    t0 = time.monotonic()
    for repeat in range(REPEATS):
        where = tmp_path / f"r{repeat}"
        (where / "shared").mkdir(parents=True)
        storage = f"sqlite:///{where / 'shared' / 'race.db'}"
        groups = _start_groups(where, storage, ["single", "single", "single"], n_trials=6, delays=[0, 0, 4.0],
                               extra=("sleep_s=1.0",))
        _wait_groups(groups, timeout_s=230)
        study = optuna.load_study(study_name="race", storage=storage)
        _assert_race_study(study, 6, 3)
        tags = {t.user_attrs.get(GROUP_ATTR) for t in study.trials}
        assert None not in tags and "none" not in tags
        assert 2 <= len(tags) <= 3, tags  # each group its own identity (a late group may find no trial left)
        logs = "".join(log.read_text() for _, log in groups)
        assert "marked FAIL" not in logs and "closed (FAIL) by another worker" not in logs
    print(f"\nC29: {REPEATS} start-up(s) passed in {time.monotonic() - t0:.0f} s")
    fault_record("C29: 3 groups launched without --rdzv-id, one late: no trial closed by another group")


# --- C18: seeded samplers on resume ---------------------------------------------------------------------


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sampler", ["random", "tpe", "qmc"])
def test_c18_a_seeded_sampler_never_replays_itself_on_resume(tmp_path, sampler, fault_record):
    common = ["x=interval(-1,1)", f"hydra/sweeper/sampler={sampler}", "hydra.sweeper.sampler.seed=7"]
    run_sweep(tmp_path / "a", *common, "hydra.sweeper.n_trials=3", nproc=1).check()
    run_sweep(tmp_path / "a", *common, "hydra.sweeper.n_trials=6", nproc=1).check()
    xs = [t.params["x"] for t in load(tmp_path / "a").trials]
    assert len(xs) == 6 and not set(xs[:3]) & set(xs[3:]), xs  # no replay
    run_sweep(tmp_path / "b", *common, "hydra.sweeper.n_trials=3", nproc=1).check()
    assert [t.params["x"] for t in load(tmp_path / "b").trials] == xs[:3]  # a new study is reproducible
    assert load(tmp_path / "a").user_attrs[RUNS_ATTR] == 2
    fault_record(f"C18 {sampler}: resume with a seed draws new params; a new study reproduces")


def test_run_seed_rule():
    # The README's rule (Resume): run k > 0 uses the first 4 bytes of sha256("<seed>/<k>"), as an
    # unsigned big-endian integer.
    assert run_seed(7, 3) == int.from_bytes(hashlib.sha256(b"7/3").digest()[:4], "big") == 1698595815
    assert run_seed(7, 0) == 7
    seeds = {run_seed(7, k) for k in range(1, 50)}
    assert len(seeds) == 49 and 7 not in seeds and all(0 <= s < 2**32 for s in seeds)
    assert run_seed(7, 3) == run_seed(7, 3) != run_seed(8, 3)


# --- C20: heartbeats --------------------------------------------------------------------------------------


def test_c20_grace_period_not_longer_than_the_heartbeat_is_refused_before_anything_is_stored(tmp_path, fault_record):
    res = run_sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.heartbeat_interval=3", "hydra.sweeper.grace_period=1",
                    nproc=1)
    assert res.returncode != 0
    assert "hydra.sweeper.grace_period=1 s is not longer than hydra.sweeper.heartbeat_interval=3 s" in res.output
    assert "Use grace_period >= 6" in res.output
    assert not (tmp_path / "sweep" / "optuna.db").exists()
    fault_record("C20: grace_period <= heartbeat_interval refused at set-up, nothing stored")


@pytest.mark.timeout(200)
def test_c20_a_trial_another_worker_closed_is_logged_and_counted_never_fatal(tmp_path, fault_record):
    env = {"DSO_STORAGE": f"sqlite:///{tmp_path / 'sweep'}/optuna.db", "DSO_STUDY": "edge_app"}
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=close_own_trial", "misuse_trial=1", env=env).check()
    assert "Trial 1 was already closed (FAIL) by another worker of the study" in res.output
    assert [t.state for t in _edge_study(tmp_path).trials] == [TrialState.COMPLETE, TrialState.FAIL,
                                                                 TrialState.COMPLETE]
    fault_record("C20: a tell that finds the trial closed elsewhere is logged, the sweep goes on")


# --- C21, C22, C26: bad input refused at set-up, nothing stored ------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["+hydra.sweeper.params={label:[a,b],lr:[0.1,0.01]}"],
         "'label' is a YAML list (['a', 'b']); 'lr' is a YAML list ([0.1, 0.01]). Write 'label: choice(a, b)', "
         "'lr: choice(0.1, 0.01)'"),
        (["+hydra.sweeper.params={model:{hidden:16}}"], "'model' is a YAML mapping"),
        (["+optimizer=choice(adamw,lion)"],
         "'+optimizer=choice(adamw,lion)': no option ['lion'] in config group 'optimizer' (available: ['adamw', 'sgd'])"),
        (["x=interval(0,1)", "+optimizer=choice(adamw,sgd)", "y=choice(1,2)"], None),  # all options exist: runs
        (["x=interval(0,1)", "hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler"],
         "that optuna.samplers.RandomSampler does not take (its arguments: seed): a key added to "
         "hydra.sweeper.sampler, or the keys of another hydra/sweeper/sampler option kept when _target_ was "
         "changed. Choose the class with hydra/sweeper/sampler=random"),
        # A key added to the chosen option (new-user trial: the message spoke only of a changed _target_).
        (["x=interval(0,1)", "hydra/sweeper/pruner=nop", "+hydra.sweeper.pruner.n_warmup_steps=1"],
         "hydra.sweeper.pruner has key(s) ['n_warmup_steps'] that optuna.pruners.NopPruner does not take (its "
         "arguments: none): a key added to hydra.sweeper.pruner"),
        (["x=interval(0,1)", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner._target_=optuna.pruners.NopPruner"],
         "Choose the class with hydra/sweeper/pruner=nop"),
        (["x=interval(0,1)", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler._target_=optuna.samplers.TPESampler"],
         None),  # keys that fit the new target: fine
    ],
)
def test_c21_c22_c26_bad_input_is_refused_before_trial_0_with_nothing_stored(tmp_path, overrides, expected, fault_record):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", *overrides, nproc=1)
    if expected is None:
        res.check()
        assert len(load(tmp_path).trials) == 2
        fault_record("C21/C22/C26: " + (expected or "valid input runs")[:60])
        return
    assert res.returncode != 0
    assert expected in res.output.replace("\n", " ")
    db = tmp_path / "sweep" / "optuna.db"
    assert not db.exists() or not optuna.get_all_study_names(f"sqlite:///{db}")
    assert not (tmp_path / "records").exists()
    fault_record("C21/C22/C26: " + (expected or "valid input runs")[:60])


@pytest.mark.timeout(200)
def test_c22_missing_group_option_is_refused_on_every_rank_and_an_existing_study_keeps_its_trials(tmp_path, fault_record):
    run_sweep(tmp_path, "x=interval(0,1)", "hydra.sweeper.n_trials=2").check()
    before = [(t.number, t.state, t.params) for t in load(tmp_path).trials]
    res = run_sweep(tmp_path, "x=interval(0,1)", "hydra.sweeper.n_trials=4", "+optimizer=choice(adamw,lion)",
                    env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert res.output.count("no option ['lion'] in config group 'optimizer'") >= 2  # rank 0's error, on both ranks
    assert [(t.number, t.state, t.params) for t in load(tmp_path).trials] == before
    fault_record("C22 at 2 ranks: refused on every rank, stored trials unchanged")


# --- C23, C28: resume ----------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_c23_the_resume_hint_is_the_exact_command_that_continues_the_study(tmp_path, fault_record):
    # The default sweep dir has a timestamp: "run the same command" would start a new study.
    res = run_torchrun(APP, ["-m", "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "fail_on_rank=1", "fail_on_trial=1",
                             "hydra.sweeper.plots=false"], cwd=tmp_path,
                       extra_env={"DSO_RECORD_DIR": str(tmp_path / "r"), **exit_env(tmp_path), **LINGER})
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)  # max_failure_rate=0: every rank stops
    line = next(ln for ln in res.output.splitlines() if "resume with: " in ln)
    command = line.split("resume with: ", 1)[1].strip().rstrip(")")
    argv = shlex.split(command)
    assert "--standalone --nproc_per_node 2 " in command and ("torchrun" in argv[0] or argv[1:3] == ["-m", "torch.distributed.run"]), command
    sweep_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir="))
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    # Paste it into a shell as printed, without the injected failure.
    pasted = shlex.join(a for a in argv if not a.startswith(("fail_on_rank=", "fail_on_trial=")))
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "r"), PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    run_command(["bash", "-c", pasted], timeout_s=150, cwd=tmp_path, env=env).check()
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE,
                                               TrialState.COMPLETE]
    fault_record("C23: the printed resume command, pasted, continues the same study")


# --- C24, C27: misuse inside the task ---------------------------------------------------------------------


@pytest.mark.timeout(200)
def test_c24_an_unguarded_init_process_group_fails_its_trial_naming_the_fix(tmp_path, fault_record):
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=init_group", "hydra.sweeper.max_failure_rate=1.0").check()
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)
    assert "guard the call with 'if not torch.distributed.is_initialized():'" in res.output
    assert [t.state for t in _edge_study(tmp_path).trials] == [TrialState.COMPLETE, TrialState.FAIL,
                                                                 TrialState.COMPLETE]
    fault_record("C24: unguarded init_process_group -> trial FAIL naming the fix")


@pytest.mark.timeout(200)
def test_c24_a_destroyed_default_group_is_named_not_reported_as_a_timeout(tmp_path, fault_record):
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=destroy_group", "hydra.sweeper.rank_timeout=120", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert res.output.count("ProcessGroupMisuseError") >= 2
    assert "the default process group was destroyed, most likely by the task" in res.output
    assert "RankTimeoutError" not in res.output
    trials = _edge_study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL]
    # Named at once, not after rank_timeout: timed from trial 1's own start, so start-up does not count.
    seconds = (trials[1].datetime_complete - trials[1].datetime_start).total_seconds()
    assert seconds < 30, f"trial 1 closed {seconds:.1f} s after it started (rank_timeout 120 s)"
    fault_record("C24: destroyed default group -> ProcessGroupMisuseError on every rank, no timeout")


@pytest.mark.timeout(200)
def test_c27_report_in_a_multi_objective_study_says_why_on_every_rank(tmp_path, fault_record):
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=report", "n_objectives=2", "hydra.sweeper.max_failure_rate=1.0",
                "hydra.sweeper.direction=[minimize,maximize]").check()
    msg = "report() needs a single-objective study, but this study has 2 directions"
    assert "rank 0: NotImplementedError: trial 1: " + msg in res.output
    assert "rank 1: NotImplementedError: trial 1: " + msg in res.output
    assert [t.state for t in _edge_study(tmp_path).trials] == [TrialState.COMPLETE, TrialState.FAIL,
                                                                 TrialState.COMPLETE]
    fault_record("C27: report() with 2 objectives -> trial FAIL with the reason on every rank")
