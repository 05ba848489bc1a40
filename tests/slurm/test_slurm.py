"""``examples/slurm/sweep.sbatch`` on a real single-node SLURM cluster (issue 14; cases C30, C31).

The module brings up munged, slurmctld and slurmd as plain processes with ``tests/slurm/cluster.sh``
(config from ``tests/slurm/slurm.conf``, on ports of its own, everything in a temporary dir) and stops
them at the end whatever happens, cancelling every job first. The recipe is submitted as a user would:
``sbatch [site options] examples/slurm/sweep.sbatch tests/apps/sweep_app.py <Hydra overrides>`` from a
submit dir, with ``DSO_STORAGE`` pointing at the PostgreSQL test server; each array task is one torchrun
group of 2 ranks on CPU/gloo, all groups on one study.

- ``test_array_of_two_groups_shares_one_study``: ``--array=0-1``; every task exits 0; the study holds
  ``n_trials`` to ``n_trials + 1`` trials, all COMPLETE, numbered without gaps or repeats; the one
  enqueued warm start is in the study once (C30); every trial ran on both ranks of one group in its own
  job dir ``<sweep dir>/<number>``; the groups' trials and job dirs are disjoint; the tasks' rendezvous
  ports differ; the logs are where the recipe says (the submit dir).
- ``test_requeue_during_a_trial``: ``scontrol requeue`` of task 1 while it runs a trial: that trial is
  closed FAIL and re-queued (``retry_failed_trials=1``), its retry COMPLETE with the same params, no
  trial left RUNNING or WAITING, the budget held; task 1 ran twice (Restarts=1) and its log holds both
  attempts (``--open-mode=append``); both tasks exit 0.
- ``test_two_arrays_at_once_on_one_node``: C31, two arrays submitted together whose task 0 share the node
  (each ``--array=0``, with logs in a ``logs/`` dir made first): both exit 0, on different rendezvous ports,
  each in its own world of 2 ranks (one group id per study, different between the studies).

The array test and the two-arrays test put every group at a start barrier in its first trial
(``tests/apps/start_barrier.py``), so SLURM's start skew between tasks cannot leave a group without a trial
or the arrays never running at once.

Skips, naming why (``pytest -rs``), only where SLURM cannot be installed (not root, or no apt-get);
fails when PostgreSQL does not answer unless ``DSO_SKIP_POSTGRES=1``. Every wait has a timeout, all
below the pytest timeout. Wall time: about 1.5 min for the module on 2 cores (apt-get install, when
needed, about 15 s more).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._stored import ENQUEUED_ATTR, GROUP_ATTR
from tests.multirank.test_shared_study import postgres_url  # noqa: F401  (the module fixture)
from tests.torchrun_utils import REPO, allowed_seconds

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
RECIPE = REPO / "examples" / "slurm" / "sweep.sbatch"
APP = REPO / "tests" / "apps" / "sweep_app.py"
RANKS = 2
N_TRIALS = 4
#: Seconds an array may take from sbatch to its last task's end (20-35 s each on 2 cores).
ARRAY_TIMEOUT_S = 200
#: Seconds for apt-get install, and for starting / stopping the daemons.
INSTALL_TIMEOUT_S = 400
CLUSTER_TIMEOUT_S = 90
#: The site options a CPU-only single-node cluster passes on the command line (the recipe's
#: #SBATCH lines are for a GPU cluster): 1 node, no GPU, 1 CPU and 1.5 GB per group.
SITE = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=1500M", "--time=0:15:00", "--partition=debug"]
#: Hydra overrides for the tiny app: rank_timeout (s) >= 15 on a loaded machine.
APP_ARGS = ["hydra.sweeper.rank_timeout=20", "hydra.sweeper.plots=false", "x=interval(-1,1)"]

pytestmark = [pytest.mark.slurm, pytest.mark.soak, pytest.mark.torchrun, pytest.mark.postgres]


# --- the cluster ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(args: list[str], timeout_s: float, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a short command (``cluster.sh``, a SLURM client) with a timeout (s); output captured."""
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(map(str, args))} did not return within {timeout_s:g} s: {e.stdout}{e.stderr}")
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


class Cluster:
    """A running single-node cluster: its dir and the environment its clients (and jobs) need."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = env

    def run(self, *args: str, timeout_s: float = 20, check: bool = True) -> subprocess.CompletedProcess:
        return _sh(list(args), timeout_s, env=self.env, check=check)

    def log_tail(self, n: int = 4000) -> str:
        return "".join(
            f"--- {f.name} ---\n{f.read_text(errors='replace')[-n:]}\n"
            for f in (self.root / "slurmctld.log", self.root / "slurmd.log")
            if f.exists()
        )


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Cluster:
    """Install SLURM when missing (skip, saying why, where that is impossible), start the daemons,
    and stop them (cancelling every job) when the module ends, however it ends."""
    missing = [b for b in ("sbatch", "scontrol", "squeue", "scancel", "sinfo") if shutil.which(b) is None]
    missing += [b for b in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged") if not os.access(b, os.X_OK)]
    if missing:
        r = _sh(["bash", str(CLUSTER_SH), "install"], INSTALL_TIMEOUT_S, check=False)
        if r.returncode == 3:
            pytest.skip(f"SLURM is not installed and cannot be installed here ({r.stderr.strip()}); "
                        "install slurm-wlm and munge (tests/slurm/cluster.sh install as root) to run the SLURM tests")
        assert r.returncode == 0, f"cluster.sh install failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    root = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ)
    env.update(SLURM_CONF=str(root / "slurm.conf"), SLURMCTLD_PORT=str(_free_port()), SLURMD_PORT=str(_free_port()))
    for k in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        env.pop(k)  # a test run inside a SLURM job must not pass that job's settings to sbatch
    cluster = Cluster(root, env)
    try:
        _sh(["bash", str(CLUSTER_SH), "start", str(root)], CLUSTER_TIMEOUT_S, env=env)
        yield cluster
    finally:
        r = _sh(["bash", str(CLUSTER_SH), "stop", str(root)], CLUSTER_TIMEOUT_S, env=env, check=False)
        if r.returncode != 0:
            print(f"cluster.sh stop exited {r.returncode}:\n{r.stdout}\n{r.stderr}")


# --- submitting and watching jobs -------------------------------------------------------------------


def _job_env(cluster: Cluster, url: str, study: str, **extra: str) -> dict[str, str]:
    """The environment a user exports before sbatch (the job inherits it)."""
    env = dict(cluster.env)
    env.update(DSO_STORAGE=url, STUDY_NAME=study, NPROC_PER_NODE=str(RANKS), PYTHON=sys.executable, **extra)
    # This checkout's package first, as in the test process itself.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _barrier_env(tmp_path: Path, groups: int) -> dict[str, str]:
    """The environment of ``tests/apps/start_barrier.py`` for ``groups`` torchrun groups of ``RANKS`` ranks
    (one dir under ``tmp_path``, shared by every job of the test)."""
    return {"DSO_START_BARRIER_DIR": str(tmp_path / "start_barrier"), "DSO_START_BARRIER_N": str(groups * RANKS)}


def _sbatch(cluster: Cluster, submit_dir: Path, env: dict[str, str], sbatch_opts: list[str], overrides: list[str]) -> str:
    """``sbatch <opts> sweep.sbatch sweep_app.py <overrides>`` from ``submit_dir``; returns the job id."""
    cmd = ["sbatch", "--parsable", *SITE, *sbatch_opts, str(RECIPE), str(APP), *APP_ARGS, *overrides]
    r = subprocess.run(cmd, cwd=submit_dir, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout.strip().split(";")[0]


def _tasks(cluster: Cluster, job_id: str) -> dict[str, dict[str, str]]:
    """``{'<array job>_<task>': fields}`` from ``scontrol -o show job`` (JobState, ExitCode, Restarts, ...).
    Finished jobs stay listed for MinJobAge (600 s in tests/slurm/slurm.conf)."""
    r = cluster.run("scontrol", "-o", "show", "job", job_id, check=False)
    out = {}
    for line in r.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "ArrayJobId" in fields:
            out[f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"] = fields
        elif "JobId" in fields:
            out[fields["JobId"]] = fields
    return out


def _logs(paths: list[Path]) -> str:
    return "".join(f"--- {p} ---\n{p.read_text(errors='replace')[-6000:] if p.exists() else '(no log)'}\n" for p in paths)


def _wait_done(cluster: Cluster, job_ids: list[str], timeout_s: float, logs: list[Path], on_poll=None) -> None:
    """Poll until no task of ``job_ids`` is pending, running or completing; on timeout cancel them and fail
    with the logs. ``on_poll(tasks)`` runs at each poll (0.5 s)."""
    limit = allowed_seconds(timeout_s)
    end = time.monotonic() + limit
    while True:
        tasks = {k: v for j in job_ids for k, v in _tasks(cluster, j).items()}
        if on_poll is not None:
            on_poll(tasks)
        if tasks and all(t["JobState"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED",
                                                  "SUSPENDED", "RESIZING") for t in tasks.values()):
            return
        if time.monotonic() > end:
            cluster.run("scancel", *job_ids, check=False)
            states = {k: (v["JobState"], v.get("Reason")) for k, v in tasks.items()}
            raise AssertionError(f"jobs {job_ids} not done after {limit:.0f} s: {states}\n{_logs(logs)}{cluster.log_tail()}")
        time.sleep(0.5)


def _assert_all_exit_zero(cluster: Cluster, job_ids: list[str], expected: int, logs: list[Path]) -> dict[str, dict]:
    tasks = {k: v for j in job_ids for k, v in _tasks(cluster, j).items()}
    summary = {k: (v["JobState"], v["ExitCode"]) for k, v in tasks.items()}
    assert len(tasks) == expected, f"expected {expected} tasks, scontrol lists {summary}"
    bad = {k: s for k, s in summary.items() if s != ("COMPLETED", "0:0")}
    assert not bad, f"tasks not COMPLETED with exit 0: {bad}\n{_logs(logs)}"
    return tasks


def _records(sweep_dir: Path) -> dict[tuple[int, int], dict]:
    """``{(trial number, rank): record}`` the app wrote in each job dir."""
    out = {}
    for f in sweep_dir.glob("*/trial*_rank*.json"):
        r = json.loads(f.read_text())
        out[(r["job_num"], r["rank"])] = r
    return out


def _port(log: str) -> str:
    m = re.search(r"rendezvous \S+:(\d+),", log)
    assert m, f"no rendezvous line in the log:\n{log[-3000:]}"
    return m.group(1)


def _assert_every_trial_ran_on_all_ranks(trials, sweep_dir: Path) -> None:
    """Each COMPLETE trial ran on both ranks in the job dir ``<sweep dir>/<number>`` with its params; no
    other job dir holds records."""
    recs = _records(sweep_dir)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for t in complete:
        per_rank = [recs.get((t.number, r)) for r in range(RANKS)]
        assert all(per_rank), f"trial {t.number}: not every rank ran it ({sorted(recs)})"
        assert {r["output_dir"] for r in per_rank} == {str(sweep_dir / str(t.number))}
        assert all(r["trial_params"] == t.params for r in per_rank), (t.params, [r["trial_params"] for r in per_rank])
    stray = {n for n, _ in recs} - {t.number for t in trials}
    assert not stray, f"job dirs of trials not in the study: {sorted(stray)}"


# --- the tests --------------------------------------------------------------------------------------


def _delete(url: str, name: str) -> None:
    try:
        optuna.delete_study(study_name=name, storage=url)
    except KeyError:
        pass


@pytest.mark.timeout(ARRAY_TIMEOUT_S + INSTALL_TIMEOUT_S + 2 * CLUSTER_TIMEOUT_S)
def test_array_of_two_groups_shares_one_study(slurm_cluster, postgres_url, tmp_path, request):  # noqa: F811
    study = f"dso-slurm-{uuid.uuid4().hex[:10]}"
    request.addfinalizer(lambda: _delete(postgres_url, study))
    # Both tasks meet at a start barrier in their first trial (tests/apps/start_barrier.py): a task that
    # SLURM starts late still runs a trial, so the two group ids below do not depend on the start skew.
    env = _job_env(slurm_cluster, postgres_url, study, **_barrier_env(tmp_path, groups=2))
    t0 = time.monotonic()
    job = _sbatch(slurm_cluster, tmp_path, env, ["--array=0-1"],
                  [f"hydra.sweeper.n_trials={N_TRIALS}", "sleep_s=4", "hydra.sweeper.enqueue_trials=[{x:0.25}]"])
    logs = [tmp_path / f"ds-optuna-{job}_{i}.out" for i in (0, 1)]  # the recipe's default: the submit dir
    _wait_done(slurm_cluster, [job], ARRAY_TIMEOUT_S, logs)
    wall = time.monotonic() - t0
    _assert_all_exit_zero(slurm_cluster, [job], 2, logs)

    s = optuna.load_study(study_name=study, storage=postgres_url)
    trials = s.get_trials(deepcopy=False)
    numbers = sorted(t.number for t in trials)
    assert numbers == list(range(len(trials))), f"trial numbers not unique/contiguous: {numbers}"
    assert all(t.state == TrialState.COMPLETE for t in trials), [(t.number, t.state.name) for t in trials]
    assert N_TRIALS <= len(trials) <= N_TRIALS + 1, f"{len(trials)} trials for n_trials={N_TRIALS} and 2 groups"
    # C30: the warm start is in the study once, although both groups opened the new study together.
    enqueued = [t.number for t in trials if t.user_attrs.get(ENQUEUED_ATTR)]
    assert len(enqueued) == 1, f"trials carrying the enqueued mark: {enqueued}"
    assert trials[enqueued[0]].params == {"x": 0.25}
    assert sum(t.params == {"x": 0.25} for t in trials) == 1

    sweep_dir = tmp_path / "multirun" / study  # the recipe's default sweep dir
    _assert_every_trial_ran_on_all_ranks(trials, sweep_dir)
    # Each group (array task) tagged its own trials; the groups' trials and job dirs are disjoint.
    by_group: dict[str, set[int]] = {}
    for t in trials:
        by_group.setdefault(t.user_attrs.get(GROUP_ATTR), set()).add(t.number)
    assert None not in by_group and len(by_group) == 2, f"trials by group id: {by_group}"
    recs = _records(sweep_dir)
    dirs = [{recs[(n, 0)]["output_dir"] for n in ns} for ns in by_group.values()]
    assert not dirs[0] & dirs[1], f"job dirs used by both groups: {dirs[0] & dirs[1]}"
    assert (sweep_dir / "optimization_results.yaml").is_file()

    texts = [p.read_text() for p in logs]
    for i, text in enumerate(texts):
        assert f"group {job}-{i} attempt 1 " in text and text.rstrip().endswith(": exit 0"), text[-3000:]
        assert f"rank 0/{RANKS} " in text and f"rank 1/{RANKS} " in text and f"rank 2/" not in text
    assert _port(texts[0]) != _port(texts[1])
    request.node.user_properties.append(("array_wall_s", round(wall, 1)))
    print(f"\n2 groups, {len(trials)} trials ({ {k: sorted(v) for k, v in by_group.items()} }) in {wall:.0f} s")


@pytest.mark.timeout(2 * ARRAY_TIMEOUT_S + INSTALL_TIMEOUT_S + 2 * CLUSTER_TIMEOUT_S)
def test_requeue_during_a_trial(slurm_cluster, postgres_url, tmp_path, request):  # noqa: F811
    study = f"dso-slurm-{uuid.uuid4().hex[:10]}"
    request.addfinalizer(lambda: _delete(postgres_url, study))
    env = _job_env(slurm_cluster, postgres_url, study, RETRY_FAILED="1")
    t0 = time.monotonic()
    job = _sbatch(slurm_cluster, tmp_path, env, ["--array=0-1"], [f"hydra.sweeper.n_trials={N_TRIALS}", "sleep_s=8"])
    logs = [tmp_path / f"ds-optuna-{job}_{i}.out" for i in (0, 1)]
    target = f"{job}_1"
    seen: dict[str, object] = {}

    def requeue_in_a_trial(tasks: dict[str, dict]) -> None:
        """Requeue task 1 once its rank 0 started a trial; then release its BeginTime hold at once
        (SLURM holds a requeued batch job for a while; an admin may release it this way)."""
        if "requeued" not in seen:
            text = logs[1].read_text(errors="replace") if logs[1].exists() else ""
            m = re.search(rf"rank 0/{RANKS} runs trial (\d+)", text)
            if m:
                time.sleep(1.0)  # well inside the 8 s trial
                slurm_cluster.run("scontrol", "requeue", target)
                seen["requeued"], seen["trial"] = time.monotonic(), int(m.group(1))
        elif tasks.get(target, {}).get("JobState") == "PENDING" and tasks[target].get("Reason") == "BeginTime":
            slurm_cluster.run("scontrol", "update", f"jobid={target}", "StartTime=now", check=False)
            seen["released"] = True

    _wait_done(slurm_cluster, [job], 2 * ARRAY_TIMEOUT_S, logs, on_poll=requeue_in_a_trial)
    wall = time.monotonic() - t0
    assert "requeued" in seen, f"task 1 never started a trial:\n{_logs(logs)}"
    tasks = _assert_all_exit_zero(slurm_cluster, [job], 2, logs)
    assert tasks[target]["Restarts"] == "1", tasks[target]
    interrupted = seen["trial"]

    s = optuna.load_study(study_name=study, storage=postgres_url)
    trials = s.get_trials(deepcopy=False)
    states = {t.number: t.state.name for t in trials}
    assert sorted(states) == list(range(len(trials))), f"trial numbers not unique/contiguous: {sorted(states)}"
    # The interrupted trial was closed FAIL and re-queued; its retry ran with the same params; nothing else failed.
    assert states[interrupted] == "FAIL", states
    with warnings.catch_warnings():  # retried_trial_number is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retried = {t.number: optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials}
    retries = [t for t in trials if retried[t.number] == interrupted]
    assert len(retries) == 1, f"retries of trial {interrupted}: {[t.number for t in retries]}, states {states}"
    assert retries[0].state == TrialState.COMPLETE and retries[0].params == trials[interrupted].params
    assert [n for n, st in states.items() if st != "COMPLETE"] == [interrupted], states
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert N_TRIALS <= len(complete) <= N_TRIALS + 1, f"{len(complete)} COMPLETE for n_trials={N_TRIALS}: {states}"
    _assert_every_trial_ran_on_all_ranks(trials, tmp_path / "multirun" / study)

    # --open-mode=append: the requeued task's log holds both attempts, in order.
    text = logs[1].read_text()
    first, second = text.find(f"group {job}-1 attempt 1 "), text.find(f"group {job}-1 attempt 2 ")
    assert 0 <= first < second, f"both attempts expected in {logs[1]}:\n{text[-4000:]}"
    assert "DUE TO JOB REQUEUE" in text[first:second], text[first:second][-3000:]
    assert f"runs trial {interrupted} " in text[first:second]
    assert text.rstrip().endswith(": exit 0"), text[-2000:]
    request.node.user_properties.append(("requeue_wall_s", round(wall, 1)))
    print(f"\nrequeue: trial {interrupted} FAIL, retried as {retries[0].number}; states {states}; {wall:.0f} s")


@pytest.mark.timeout(ARRAY_TIMEOUT_S + INSTALL_TIMEOUT_S + 2 * CLUSTER_TIMEOUT_S)
def test_two_arrays_at_once_on_one_node(slurm_cluster, postgres_url, tmp_path, request):  # noqa: F811
    """C31: the second array used to join the first one's rendezvous (same port for task 0 of both) and
    die when the first ended; the first array here is the shorter one, so that would show."""
    (tmp_path / "logs").mkdir()  # the documented way to log elsewhere: make the dir, pass --output
    out = ["--output=logs/%x-%A_%a.out"]
    studies = {"short": (f"dso-slurm-{uuid.uuid4().hex[:10]}", 2), "long": (f"dso-slurm-{uuid.uuid4().hex[:10]}", 4)}
    for name, _ in studies.values():
        request.addfinalizer(lambda name=name: _delete(postgres_url, name))
    t0 = time.monotonic()
    # A start barrier across both arrays (tests/apps/start_barrier.py): each one's first trial waits until
    # both run, so "seen RUNNING together" holds whatever SLURM's start skew.
    jobs = {
        key: _sbatch(slurm_cluster, tmp_path,
                     _job_env(slurm_cluster, postgres_url, name, **_barrier_env(tmp_path, groups=2)),
                     ["--array=0", *out], [f"hydra.sweeper.n_trials={n}", "sleep_s=2"])
        for key, (name, n) in studies.items()
    }
    logs = [tmp_path / "logs" / f"ds-optuna-{j}_0.out" for j in jobs.values()]
    started: dict[str, bool] = {}

    def both_running(tasks):
        if all(t["JobState"] == "RUNNING" for t in tasks.values()) and len(tasks) == 2:
            started["together"] = True

    _wait_done(slurm_cluster, list(jobs.values()), ARRAY_TIMEOUT_S, logs, on_poll=both_running)
    wall = time.monotonic() - t0
    _assert_all_exit_zero(slurm_cluster, list(jobs.values()), 2, logs)
    assert started.get("together"), "the two arrays never ran at the same time on the node"

    texts = [p.read_text() for p in logs]
    assert _port(texts[0]) != _port(texts[1]), "two arrays on one node share a rendezvous port (C31)"
    groups = []
    for (key, (name, n)), text in zip(studies.items(), texts):
        trials = optuna.load_study(study_name=name, storage=postgres_url).get_trials(deepcopy=False)
        assert [t.state for t in trials] == [TrialState.COMPLETE] * n, (key, [t.state.name for t in trials])
        ids = {t.user_attrs.get(GROUP_ATTR) for t in trials}
        assert len(ids) == 1 and None not in ids, (key, ids)
        groups.append(ids.pop())
        assert f"rank 1/{RANKS} " in text and "rank 2/" not in text and "rank 3/" not in text, text[-3000:]
        assert "RendezvousConnectionError" not in text, text[-3000:]
    assert groups[0] != groups[1], "the two arrays ran in one world"
    request.node.user_properties.append(("two_arrays_wall_s", round(wall, 1)))
    print(f"\ntwo arrays on one node: ports {_port(texts[0])}, {_port(texts[1])}; {wall:.0f} s")


@pytest.mark.timeout(ARRAY_TIMEOUT_S + INSTALL_TIMEOUT_S + 2 * CLUSTER_TIMEOUT_S)
def test_trial_groups_inside_one_array_task(slurm_cluster, postgres_url, tmp_path, request):  # noqa: F811
    """The recipe takes ``hydra.sweeper.n_jobs`` (issue 23): one array task of RANKS ranks split into RANKS
    single-rank trial groups runs every trial of the budget (exactly, within the launch) on both groups."""
    study = f"dso-slurm-{uuid.uuid4().hex[:10]}"
    request.addfinalizer(lambda: _delete(postgres_url, study))
    env = _job_env(slurm_cluster, postgres_url, study)
    job = _sbatch(slurm_cluster, tmp_path, env, ["--array=0"],
                  [f"hydra.sweeper.n_trials={N_TRIALS}", f"hydra.sweeper.n_jobs={RANKS}", "sleep_s=1"])
    logs = [tmp_path / f"ds-optuna-{job}_0.out"]
    _wait_done(slurm_cluster, [job], ARRAY_TIMEOUT_S, logs)
    _assert_all_exit_zero(slurm_cluster, [job], 1, logs)
    trials = optuna.load_study(study_name=study, storage=postgres_url).get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * N_TRIALS, [(t.number, t.state.name) for t in trials]
    assert {t.user_attrs.get("ds_optuna:trial_group") for t in trials} == set(range(RANKS)), _logs(logs)
    assert f"trial group 1/{RANKS}" in logs[0].read_text()
