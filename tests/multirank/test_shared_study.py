"""Scale-out under real torchrun (case C10, issue 5): several torchrun groups on one study, and one
torchrun world spread over two "nodes" of this machine.

- Two ``torchrun --standalone`` groups (2 ranks each) started at the same moment on one PostgreSQL
  study (each its own sweep dir, or one shared sweep dir), on one Optuna journal file, and with the
  grid sampler. ``n_trials`` is the study's total budget; each group's rank 0 counts the stored
  trials and then asks, so concurrent groups may overshoot it by at most one trial per extra group.
- Two ``torchrun --nnodes 2`` agents with a c10d rendezvous on localhost form one world of 4 ranks.

``make test`` runs one launch pair per contract (issue 39): two groups on one PostgreSQL study in one shared
sweep dir (both groups' job dirs and plots in one folder). The two-node world (torchrun's own c10d
rendezvous: the sweeper sees a world of 4 as in one agent) and the other layouts and storages
(own sweep dirs, Redis, a journal file, a bare Redis journal backend, the grid sampler shared by two groups) run
the same sweeper code with another storage URL; their sharing is Optuna's storage plumbing (Optuna's own tests
cover each storage under concurrent writers), so they run under ``make soak``.

PostgreSQL: ``DSO_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``). With no
server answering the PostgreSQL tests fail, saying so; they are skipped only when the user opts out
explicitly with ``DSO_SKIP_POSTGRES=1`` (docs/contributing/tests.md, "Tests"). Every test uses its own study name and
deletes that study at the end.

Timeouts are layered: ``rank_timeout`` (30 s) < the torchrun subprocess timeout (capped by the
test's deadline) < pytest's timeout. Every process is started and killed through
``tests/torchrun_utils.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._stored import GROUP_ATTR
from tests.torchrun_utils import REPO, allowed_seconds, base_env, kill_tree, start_process

APP = REPO / "tests" / "apps" / "sweep_app.py"
N_TRIALS = 6
RANKS = 2
#: Seconds the two groups may take together (each alone takes about 7 s on 2 cores).
GROUP_TIMEOUT_S = 150
PG_DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: Set to 1 to skip the PostgreSQL tests on purpose (the only way they do not run).
SKIP_ENV = "DSO_SKIP_POSTGRES"

pytestmark = [pytest.mark.torchrun]


# --- storage fixtures -----------------------------------------------------------------------------


def _opted_out() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def postgres_url() -> str:
    """The PostgreSQL URL, checked once.

    ``DSO_SKIP_POSTGRES=1``: skip (the user opted out). Otherwise, no server answering on the URL's
    host and port, or a server that answers but cannot be used (driver missing, bad credentials, no
    such database): fail, naming why and how to opt out.
    """
    import sqlalchemy

    url = os.environ.get("DSO_TEST_POSTGRES_URL", PG_DEFAULT_URL)
    if _opted_out():
        pytest.skip(f"{SKIP_ENV}=1: the PostgreSQL tests were skipped on request")
    parsed = sqlalchemy.engine.make_url(url)
    if parsed.host:  # a host, not a unix socket: does anything answer there?
        refused = None
        try:
            socket.create_connection((parsed.host, parsed.port or 5432), timeout=5).close()
        except OSError as e:
            refused = e
        if refused is not None:
            pytest.fail(
                f"no PostgreSQL server answers at {parsed.host}:{parsed.port or 5432} ({refused}), so the tests of "
                f"shared PostgreSQL studies cannot run. Start one (trust auth, database "
                f"'{parsed.database}'), point DSO_TEST_POSTGRES_URL at one, or skip these tests on purpose "
                f"with {SKIP_ENV}=1.",
                pytrace=False,
            )
    try:
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = ""
        if isinstance(e, ImportError) or "No module named" in first:
            hint = (
                f" SQLAlchemy {sqlalchemy.__version__} uses the driver '{parsed.get_dialect().driver}' for "
                f"'{parsed.drivername}://' URLs; install it, or name the installed driver in the URL "
                "(e.g. postgresql+psycopg2://...)."
            )
        pytest.fail(f"a PostgreSQL server answers for {parsed.render_as_string()} but cannot be used: "
                    f"{type(e).__name__}: {first}.{hint} (or skip these tests on purpose with {SKIP_ENV}=1)",
                    pytrace=False)
    return url


REDIS_DEFAULT_URL = "redis://127.0.0.1:6379/4"
#: Set to 1 (``.ci/run`` does) to make the Redis tests fail, not skip, when no Redis server answers.
REQUIRE_REDIS_ENV = "DSO_REQUIRE_REDIS"


@pytest.fixture(scope="module")
def redis_url() -> str:
    """The Redis URL of the journal-storage tests (``DSO_TEST_REDIS_URL``, default :data:`REDIS_DEFAULT_URL`),
    checked once: with no server answering or without the ``redis`` package, skip, saying why, or fail
    when ``DSO_REQUIRE_REDIS=1`` (case C56)."""
    url = os.environ.get("DSO_TEST_REDIS_URL", REDIS_DEFAULT_URL)
    required = os.environ.get(REQUIRE_REDIS_ENV, "").strip().lower() in ("1", "true", "yes")
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        client.ping()
        client.close()
    except Exception as e:
        why = (f"no Redis server usable at {url} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
               "pip install '.[redis]' and start redis-server, or set DSO_TEST_REDIS_URL")
        if required:
            pytest.fail(f"{REQUIRE_REDIS_ENV}=1 but {why}", pytrace=False)
        pytest.skip(why)
    return url


@pytest.fixture
def redis_study(redis_url):
    """A fresh study name on the Redis journal; the study is deleted afterwards."""
    from hydra_plugins.ds_optuna_sweeper._study._storage import open_storage

    name = f"dso-test-{uuid.uuid4().hex[:12]}"
    yield redis_url, name
    try:
        optuna.delete_study(study_name=name, storage=open_storage(redis_url, heartbeat_interval_s=None,
                                                                  grace_period_s=None, max_retry=0))
    except KeyError:
        pass


@pytest.fixture
def pg_study(postgres_url):
    """A fresh study name on the PostgreSQL server; the study is deleted afterwards."""
    name = f"dso-test-{uuid.uuid4().hex[:12]}"
    yield postgres_url, name
    try:
        optuna.delete_study(study_name=name, storage=postgres_url)
    except KeyError:  # never created (the groups failed before opening the storage)
        pass


# --- starting and watching torchrun processes -----------------------------------------------------


@dataclass
class Group:
    """One torchrun process (one group, or one node of a multi-node world) and where it writes."""

    name: str
    proc: subprocess.Popen
    log: Path
    records: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _start(name: str, tmp_path: Path, torchrun_args: list[str], app_args: list[str], records: Path | None = None,
           env: dict[str, str] | None = None) -> Group:
    """Start ``torchrun <torchrun_args> sweep_app.py <app_args>`` in its own session, output to a file;
    ``env`` is added to the app's environment."""
    records = records or tmp_path / f"records_{name}"
    log = tmp_path / f"{name}.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, str(APP), *app_args]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = start_process(cmd, cwd=tmp_path, env=base_env(DSO_RECORD_DIR=str(records), **(env or {})), stdout=f)
    return Group(name, proc, log, records)


def _kill(groups: list[Group]) -> None:
    """Kill every process of each group: torchrun and its ranks (each in its own session)."""
    for g in groups:
        kill_tree(g.proc)


def _wait(groups: list[Group], timeout_s: float) -> dict[str, int]:
    """Wait for every process, at most ``timeout_s`` (capped by the test's deadline) for all together;
    on timeout kill them all and fail with each one's output tail. Nothing is left running on any way out."""
    limit = allowed_seconds(timeout_s)
    deadline = time.monotonic() + limit
    try:
        for g in groups:
            g.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(groups)
        tails = "\n".join(f"--- {g.name} ---\n{g.output()[-4000:]}" for g in groups)
        raise AssertionError(f"timed out after {limit:.0f} s (a hang?)\n{tails}") from None
    finally:
        _kill(groups)  # never leave a process behind, also when pytest's timeout fires in the wait
    return {g.name: g.proc.returncode for g in groups}


def _check_exit_zero(groups: list[Group], rcs: dict[str, int]) -> None:
    bad = [g for g in groups if rcs[g.name] != 0]
    if bad:
        tails = "\n".join(f"--- {g.name} (exit {rcs[g.name]}) ---\n{g.output()[-6000:]}" for g in bad)
        raise AssertionError(f"expected every torchrun to exit 0, got {rcs}\n{tails}")


def _standalone(tmp_path: Path, name: str, sweep_dir: Path, storage: str, study_name: str, *overrides: str,
                plots: bool = False) -> Group:
    """One of the two groups on one study. They meet at a start barrier in their first trial
    (``tests/apps/start_barrier.py``), so a group that starts late still runs a trial. No plots (about 3 s
    of CPU per group, asserted by nobody here) unless ``plots``."""
    return _start(
        name,
        tmp_path,
        ["--standalone", "--nproc-per-node", str(RANKS)],
        [
            "-m",
            f"hydra.sweep.dir={sweep_dir}",
            f"hydra.sweeper.storage={storage}",
            f"hydra.sweeper.study_name={study_name}",
            f"hydra.sweeper.n_trials={N_TRIALS}",
            "hydra.sweeper.rank_timeout=30",
            "sleep_s=0.5",  # trials overlap between the groups
            f"hydra.sweeper.plots={str(plots).lower()}",
            *overrides,
        ],
        env={"DSO_START_BARRIER_DIR": str(tmp_path / "start_barrier"), "DSO_START_BARRIER_N": str(2 * RANKS)},
    )


def _records(group: Group) -> dict[tuple[int, int], dict]:
    """``{(trial number, rank): record}`` written by the app on the ranks of one group."""
    out = {}
    for f in sorted(group.records.glob("trial*_rank*.json")):
        r = json.loads(f.read_text())
        out[(r["job_num"], r["rank"])] = r
    return out


# --- what every shared-study run must show --------------------------------------------------------


def _assert_shared_study(study: optuna.Study, groups: list[Group], sweep_dirs: dict[str, Path]) -> dict:
    """The C10 promises for groups that ran at once on one study; returns numbers for the report.

    - the study holds between n_trials and n_trials + (groups - 1) trials, all COMPLETE (none left
      RUNNING), numbered 0..k-1 without gaps or repeats;
    - every trial was run by exactly one group, on all of its ranks, in one job dir
      ``<that group's sweep dir>/<trial number>``; no job dir was used by two groups;
    - every group ran at least one trial (the start barrier guarantees it whatever the start-up skew),
      and its rank 0 tagged its trials with its own group id.
    """
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert TrialState.RUNNING not in states, f"trials left RUNNING: {states}"
    assert all(s == TrialState.COMPLETE for s in states), states
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials))), f"trial numbers not unique/contiguous: {numbers}"
    assert N_TRIALS <= len(trials) <= N_TRIALS + len(groups) - 1, (
        f"{len(trials)} trials for n_trials={N_TRIALS} with {len(groups)} groups: the budget may be overshot by "
        f"at most {len(groups) - 1}"
    )

    ran: dict[str, set[int]] = {}
    dirs: dict[str, set[str]] = {}
    for g in groups:
        recs = _records(g)
        nums = {n for n, _ in recs}
        assert nums, f"group {g.name} ran no trial"
        for n in nums:
            per_rank = [recs.get((n, r)) for r in range(RANKS)]
            assert all(per_rank), f"group {g.name}, trial {n}: not every rank ran it ({sorted(recs)})"
            assert len({r["output_dir"] for r in per_rank}) == 1, f"group {g.name}, trial {n}: ranks' job dirs differ"
            assert len({r["config_hash"] for r in per_rank}) == 1, f"group {g.name}, trial {n}: ranks' configs differ"
            assert all(r["trial_number"] == n for r in per_rank)
            assert per_rank[0]["output_dir"] == str(sweep_dirs[g.name] / str(n))
        ran[g.name] = nums
        dirs[g.name] = {r["output_dir"] for r in recs.values()}

    a, b = (g.name for g in groups)
    assert not ran[a] & ran[b], f"trials run by both groups: {sorted(ran[a] & ran[b])}"
    assert not dirs[a] & dirs[b], f"job dirs used by both groups: {sorted(dirs[a] & dirs[b])}"
    assert ran[a] | ran[b] == set(numbers), f"study {sorted(numbers)} vs run {sorted(ran[a] | ran[b])}"

    # rank 0 of each group tagged its trials with its torchrun run id; one id per group.
    tags = {g.name: {trials[n].user_attrs.get(GROUP_ATTR) for n in ran[g.name]} for g in groups}
    assert all(len(t) == 1 and None not in t for t in tags.values()), tags
    assert tags[a] != tags[b], tags

    for d in set(sweep_dirs.values()):
        results = OmegaConf.load(d / "optimization_results.yaml")  # written whole (os.replace)
        assert results.study_name == study.study_name
        assert results.best_trial in numbers
    return {"trials": len(trials), "per_group": {k: sorted(v) for k, v in ran.items()}}


def _report(request, **facts) -> None:
    """Keep the measured facts (overshoot, duplicates) in the JUnit report and print them (-s / -rP)."""
    for k, v in facts.items():
        request.node.user_properties.append((k, v))
    print(f"\n{request.node.name}: {facts}")


# --- the tests --------------------------------------------------------------------------------------


@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
@pytest.mark.parametrize("layout", [pytest.param("own_sweep_dirs", marks=pytest.mark.soak), "shared_sweep_dir"])
@pytest.mark.parametrize("server", [pytest.param("postgresql", marks=pytest.mark.postgres),
                                    pytest.param("redis", marks=[pytest.mark.redis, pytest.mark.soak])])
def test_two_groups_share_one_server_study(tmp_path, server, layout, request):
    """Two groups on one study of a database server: PostgreSQL, or Redis given as its URL
    (``redis://host:port/db``, a ``JournalStorage`` over a ``JournalRedisBackend``, case C56)."""
    url, study_name = request.getfixturevalue("pg_study" if server == "postgresql" else "redis_study")
    if layout == "shared_sweep_dir":
        sweep_dirs = {"g0": tmp_path / "sweep", "g1": tmp_path / "sweep"}
    else:
        sweep_dirs = {"g0": tmp_path / "sweep_g0", "g1": tmp_path / "sweep_g1"}
    storage = f"'{url}'"
    # In one shared sweep dir both groups' rank 0 also write the plots into the same plots/ folder, as they would.
    groups = [
        _standalone(tmp_path, name, sweep_dirs[name], storage, study_name, "x=interval(-1,1)",
                    plots=layout == "shared_sweep_dir")
        for name in ("g0", "g1")
    ]
    rcs = _wait(groups, GROUP_TIMEOUT_S)
    _check_exit_zero(groups, rcs)

    study = optuna.load_study(study_name=study_name, storage=_reader(url))
    facts = _assert_shared_study(study, groups, sweep_dirs)
    # Job dirs on disk: one per trial number, no more (a shared sweep dir holds both groups' dirs).
    on_disk = sorted(int(p.name) for d in set(sweep_dirs.values()) for p in d.iterdir() if p.name.isdigit())
    assert on_disk == sorted(t.number for t in study.trials)
    for t in study.trials:
        assert t.values[0] == t.params["x"] ** 2 + 1.0  # the app's objective, y=1
    _report(request, overshoot=facts["trials"] - N_TRIALS, per_group=facts["per_group"])


def _reader(url: str):
    """This process's storage for ``url``: the URL itself, or the sweeper's ``JournalStorage`` for ``redis://``."""
    from hydra_plugins.ds_optuna_sweeper._study._storage import open_storage
    from hydra_plugins.ds_optuna_sweeper._study._storage_text import is_redis_url

    return open_storage(url, heartbeat_interval_s=None, grace_period_s=None, max_retry=0) if is_redis_url(url) else url


@pytest.mark.soak
@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
@pytest.mark.parametrize("server", [pytest.param("postgresql", marks=pytest.mark.postgres),
                                    pytest.param("redis", marks=pytest.mark.redis)])
def test_grid_sampler_shared_by_two_groups_tries_each_point(tmp_path, server, request):
    """Optuna 5's GridSampler gives trial number n < grid size the n-th point of a grid shuffled with
    ``seed or 0`` (optuna/samplers/_grid.py), the same order in every group: as trial numbers are
    unique, so are the points. A trial beyond the grid size (budget overshoot) re-evaluates a point
    still running or already tried; that case is counted and reported, not hidden."""
    url, study_name = request.getfixturevalue("pg_study" if server == "postgresql" else "redis_study")
    sweep_dirs = {"g0": tmp_path / "sweep_g0", "g1": tmp_path / "sweep_g1"}
    groups = [
        _standalone(tmp_path, name, sweep_dirs[name], f"'{url}'", study_name, "hydra/sweeper/sampler=grid",
                    "y=range(1,7)")
        for name in ("g0", "g1")
    ]
    rcs = _wait(groups, GROUP_TIMEOUT_S)
    _check_exit_zero(groups, rcs)

    study = optuna.load_study(study_name=study_name, storage=_reader(url))
    facts = _assert_shared_study(study, groups, sweep_dirs)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    within_grid = [t.params["y"] for t in complete if t.number < N_TRIALS]
    assert sorted(within_grid) == [1, 2, 3, 4, 5, 6], f"grid points of trials 0..5: {sorted(within_grid)}"
    beyond = [(t.number, t.params["y"]) for t in complete if t.number >= N_TRIALS]
    # Each rank's config holds its trial's grid point.
    for g in groups:
        for (n, _), rec in _records(g).items():
            assert rec["config"]["y"] == study.trials[n].params["y"]
    _report(request, overshoot=facts["trials"] - N_TRIALS, duplicate_points=beyond, per_group=facts["per_group"])


def _two_groups_in_own_sweep_dirs(tmp_path, storage: str, study_name: str):
    """Run groups g0 and g1 (``x=interval(-1,1)``) on ``storage``, each in its own sweep dir, both to exit 0.
    Returns ``(groups, {"g0": sweep dir, "g1": sweep dir})``."""
    sweep_dirs = {"g0": tmp_path / "sweep_g0", "g1": tmp_path / "sweep_g1"}
    groups = [
        _standalone(tmp_path, name, sweep_dirs[name], storage, study_name, "x=interval(-1,1)") for name in ("g0", "g1")
    ]
    _check_exit_zero(groups, _wait(groups, GROUP_TIMEOUT_S))
    return groups, sweep_dirs


@pytest.mark.soak
@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
def test_two_groups_share_one_journal_file(tmp_path, request):
    """Optuna's journal file storage (a shared filesystem), given as a ``_target_`` node on the
    command line with Hydra's grammar."""
    journal = tmp_path / "journal.log"
    storage = (
        "{_target_:optuna.storages.JournalStorage,log_storage:"
        f"{{_target_:optuna.storages.journal.JournalFileBackend,file_path:'{journal}'}}}}"
    )
    study_name = f"dso-test-{uuid.uuid4().hex[:12]}"
    groups, sweep_dirs = _two_groups_in_own_sweep_dirs(tmp_path, storage, study_name)

    assert journal.is_file()
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name=study_name, storage=optuna.storages.JournalStorage(backend))
    facts = _assert_shared_study(study, groups, sweep_dirs)
    _report(request, overshoot=facts["trials"] - N_TRIALS, per_group=facts["per_group"])


@pytest.mark.soak
@pytest.mark.redis
@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
def test_two_groups_share_one_redis_journal_given_as_a_bare_backend(tmp_path, redis_study, request):
    """Case C56's command line: the journal backend alone as a ``_target_`` node
    (``{_target_:optuna.storages.journal.JournalRedisBackend,url:...}``) is wrapped in ``JournalStorage``; it
    failed with AttributeError 'JournalRedisBackend' object has no attribute 'create_new_study'."""
    url, study_name = redis_study
    storage = f"{{_target_:optuna.storages.journal.JournalRedisBackend,url:'{url}'}}"
    groups, sweep_dirs = _two_groups_in_own_sweep_dirs(tmp_path, storage, study_name)
    study = optuna.load_study(study_name=study_name, storage=_reader(url))
    facts = _assert_shared_study(study, groups, sweep_dirs)
    _report(request, overshoot=facts["trials"] - N_TRIALS, per_group=facts["per_group"])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.soak  # torchrun's rendezvous; make test: the 4-rank world of test_trial_groups.py
@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
def test_two_node_torchrun_is_one_world_of_four_ranks(tmp_path):
    """``torchrun --nnodes 2`` twice on this machine (c10d rendezvous on localhost): one world of 4
    ranks; world rank 0 samples, every rank runs every trial with the same config and job dir."""
    port, rdzv_id = _free_port(), uuid.uuid4().hex
    records = tmp_path / "records"
    sweep = tmp_path / "sweep"
    nodes = [
        _start(
            f"node{node_rank}",
            tmp_path,
            ["--nnodes", "2", "--nproc-per-node", str(RANKS), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id],
            ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=3", "hydra.sweeper.rank_timeout=30",
             "hydra.sweeper.plots=false", "x=interval(-1,1)", "model.hidden=choice(16,32)"],
            records=records,
        )
        for node_rank in (0, 1)
    ]
    rcs = _wait(nodes, GROUP_TIMEOUT_S)
    _check_exit_zero(nodes, rcs)

    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert [t.number for t in study.trials] == [0, 1, 2]
    recs = _records(nodes[0])
    world = 2 * RANKS
    assert sorted(recs) == [(n, r) for n in range(3) for r in range(world)], sorted(recs)
    for t in study.trials:
        per_rank = [recs[(t.number, r)] for r in range(world)]
        assert len({r["config_hash"] for r in per_rank}) == 1, f"trial {t.number}: configs differ across the world"
        assert {r["output_dir"] for r in per_rank} == {str(sweep / str(t.number))}
        assert all(r["trial_params"] == t.params for r in per_rank)
        assert all(r["config"]["x"] == t.params["x"] for r in per_rank)
    # The sweep ran once, in the world: one study line, one "world of 4" per rank.
    logs = nodes[0].output() + nodes[1].output()
    assert logs.count("Search space:") == 1
    assert all(logs.count(f"ds_optuna: rank {r}/{world} (") == 1 for r in range(world)), logs[-4000:]
