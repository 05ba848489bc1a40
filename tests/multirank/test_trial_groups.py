"""Several trials at once inside one torchrun launch (issue 23): ``hydra.sweeper.n_jobs=K`` splits the world
into K trial groups that each ask global rank 0's study service when free.

Real torchrun worlds of the test app (``tests/apps/sweep_app.py``: each rank records what it saw, its trial's
span, and its process's observed exit status), real SQLite studies read back with Optuna. The app's
``fault.rank`` and ``fail_on_rank`` name *global* ranks (read before the split).
"""

from __future__ import annotations

import json
import re
import signal
import time

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.multirank import test_shared_study as shared
from tests.multirank.sweep_helpers import exit_lines, exit_statuses, load, records, run_sweep
from tests.multirank.test_shared_study import pg_study, postgres_url  # noqa: F401 (fixtures)
from tests.torchrun_utils import base_env, start_process, time_left, torchrun_command, wait_process

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, F, P, W = TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.WAITING
GROUP = "ds_optuna:trial_group"


def _spans(tmp_path) -> dict[int, tuple[float, float]]:
    """``{trial number: (start, end)}`` of each trial's task on the rank that recorded it."""
    out = {}
    for f in (tmp_path / "records").glob("span_trial*_rank*.json"):
        number = int(re.match(r"span_trial(\d+)_rank", f.name).group(1))
        span = json.loads(f.read_text())
        out[number] = (span["start"], span["end"])
    return out


def _groups(study) -> dict[int, int]:
    return {t.number: t.user_attrs.get(GROUP) for t in study.trials}


def test_two_single_rank_groups_run_trials_at_once_each_in_a_world_of_one(tmp_path):
    """2 ranks, ``n_jobs=2``: two single-rank trial groups run their trials side by side (the spans of trials
    of different groups overlap), each task sees a world of one (``WORLD_SIZE=1``,
    ``dist.get_world_size() == 1``), the budget is exact (``n_trials=7`` gives 7 trials), nothing stays
    RUNNING, there is one results file, and every rank exits 0."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=7", "x=interval(-1,1)", "sleep_s=1.5",
                    "hydra.sweeper.plots=false").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 7
    groups = _groups(study)
    assert set(groups.values()) == {0, 1}, groups
    recs = records(tmp_path)
    assert {number for number, _ in recs} == set(range(7))
    for (number, rank), rec in recs.items():
        assert rank == groups[number], (number, rank)  # global rank g is trial group g's one rank
        assert rec["env"]["WORLD_SIZE"] == "1" and rec["env"]["RANK"] == "0" and rec["env"]["LOCAL_RANK"] == "0"
        assert rec["dist_world_size"] == 1 and rec["dist_rank"] == 0
        assert rec["env"]["DS_OPTUNA_TRIAL_GROUP"] == f"{groups[number]}/2"  # the task can tell its group
    spans = _spans(tmp_path)
    overlaps = [(a, b) for a in spans for b in spans if groups[a] == 0 and groups[b] == 1
                and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
    assert len(overlaps) >= 3, (spans, groups)  # 7 trials of 1.5 s on two groups: most of them side by side
    # group 1's rank names its group (both processes are "rank 0/1" of their own world), and rank 0 ends with one
    # summary line
    assert re.search(r"rank 0/1 of trial group 1/2 runs trial \d+ with params", res.output), res.output[-3000:]
    assert "Sweep finished: every trial group is done (2 groups)" in res.output, res.output[-3000:]
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert results["trials_in_study"] == 7 and results["states"] == {"COMPLETE": 7}
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()) == list(range(7))
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)


def test_two_groups_of_two_ranks_agree_within_each_group(tmp_path):
    """4 ranks, ``n_jobs=2``: two 2-rank trials at once, each with the rank-consistent calls (``report``,
    ``should_prune`` through global rank 0's service for group 1) and training collectives on its own
    default group; both ranks of a trial compose the same config and see a world of 2."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4", "x=interval(-1,1)",
                    "steps=3", "collectives=2", "sleep_s=0.5", "hydra.sweeper.plots=false", nproc=4,
                    timeout_s=240).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 4
    assert all(sorted(t.intermediate_values) == [0, 1, 2] for t in study.trials)
    groups = _groups(study)
    assert set(groups.values()) == {0, 1}, groups
    recs = records(tmp_path)
    for number, group in groups.items():
        pair = [recs[(number, 2 * group + r)] for r in range(2)]  # global ranks 2g, 2g+1
        assert [p["env"]["RANK"] for p in pair] == ["0", "1"] and {p["env"]["WORLD_SIZE"] for p in pair} == {"2"}
        assert {p["dist_world_size"] for p in pair} == {2}
        assert pair[0]["config_hash"] == pair[1]["config_hash"]
        assert pair[0]["env"]["MASTER_PORT"] == pair[1]["env"]["MASTER_PORT"]  # the group's own store
    ports = {recs[(n, 2 * g)]["env"]["MASTER_PORT"] for n, g in groups.items()}
    assert len(ports) == 2, ports  # one store per trial group
    assert re.search(r"\[\d/4\] Trial \d \(group 1\) COMPLETE", res.output), res.output[-3000:]
    assert exit_statuses(tmp_path) == {r: 0 for r in range(4)}, exit_lines(tmp_path)


@pytest.mark.parametrize("pruner", ["median", "successive_halving"])
def test_pruning_with_concurrent_trials(tmp_path, pruner):
    """Both groups' trials report each step to global rank 0's study (group 1's over the service) while the
    other group's trials run; the pruner sees every reported step and prunes later, worse trials."""
    settings = {"median": ["hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=0"],
                "successive_halving": ["hydra.sweeper.pruner.min_resource=1", "hydra.sweeper.pruner.reduction_factor=2"]}
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=8", "x=interval(-1,1)", "steps=4",
              "sleep_s=0.3", f"hydra/sweeper/pruner={pruner}", *settings[pruner], "hydra.sweeper.plots=false",
              timeout_s=240).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert len(states) == 8 and set(states) <= {C, P}, states
    assert P in states, states  # the app's objective grows with the trial number: later trials are pruned
    assert set(_groups(study).values()) == {0, 1}
    for t in study.trials:
        steps = sorted(t.intermediate_values)
        assert steps == list(range(len(steps))) and steps, (t.number, steps)  # no step lost or stored twice
        if t.state == P:  # the task stopped at the step the pruner answered
            pruned_at = json.loads(next((tmp_path / "records").glob(f"pruned_trial{t.number}_rank*.json")).read_text())
            assert pruned_at["step"] == steps[-1]
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)


def test_a_failing_trial_in_one_group_leaves_the_other_group_running(tmp_path):
    """Group 1's task raises in every trial (``fail_on_rank=1``, its only rank): each of its trials is told
    FAIL, group 0 goes on completing its own, and the budget and exit statuses hold."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=6", "x=interval(-1,1)", "sleep_s=0.5",
                    "fail_on_rank=1", "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.plots=false").check()
    study = load(tmp_path)
    groups = _groups(study)
    assert len(study.trials) == 6
    for t in study.trials:
        assert t.state == (F if groups[t.number] == 1 else C), (t.number, t.state, groups[t.number])
    assert {0, 1} <= set(groups.values())
    assert "(group 1) FAIL" in res.output and "injected failure on rank 1" in res.output
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)


@pytest.mark.parametrize("retry", [0, 1])
def test_kill9_in_one_group_restarts_the_launch_and_closes_every_groups_trial(tmp_path, retry):
    """kill -9 of global rank 1 (group 1) in its first trial, ``--max-restarts 1``: torchrun stops the
    launch (SIGTERM to global rank 0, which closes every group's running trial, or the restarted launch
    closes them), restarts it, and the restarted launch finishes the study with the exact budget; with
    ``retry_failed_trials=1`` the closed trials are re-queued with their params and run again."""
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=5", "x=interval(-1,1)", "sleep_s=1",
              "fault.kind=kill9", "fault.rank=1", "fault.attempt=0", f"hydra.sweeper.retry_failed_trials={retry}",
              "hydra.sweeper.plots=false", timeout_s=200, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and W not in states, states
    failed = [t for t in study.trials if t.state == F]
    assert 1 <= len(failed) <= 2, states  # group 1's killed trial, and group 0's if it was running then
    assert (states.count(C) == 5) if retry else (states.count(C) + len(failed) == 5), states
    if retry:
        for t in failed:  # each closed trial ran again with its params (and is replaced by it in the budget)
            assert any(r.system_attrs.get("failed_trial") == t.number and r.params == t.params and r.state == C
                       for r in study.trials), (t.number, states)
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=0).get(1) == -9, lines
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines


def test_sigterm_closes_every_groups_running_trial_and_rank0_exits_143(tmp_path):
    """SIGTERM to torchrun while both groups run a trial: global rank 0 closes both (re-queued with
    ``retry_failed_trials=1``) and exits 143 before the other group's first rank (SIGTERM's default action) is
    waited for; the same command resumes and runs the re-queued trials first."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "hydra.sweeper.retry_failed_trials=1",
            "hydra.sweeper.plots=false"]
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "records"), DSO_EXIT_DIR=str(tmp_path / "exits"))
    with open(tmp_path / "preempted.log", "w") as out:
        proc = start_process(torchrun_command("tests/apps/sweep_app.py", args + ["sleep_s=60"], nproc=2),
                             cwd=tmp_path, env=env, stdout=out)
    left = time_left()
    deadline = time.monotonic() + (90 if left is None else min(90, left - 90))
    while len(list((tmp_path / "records").glob("trial*_rank*.json"))) < 2:  # both groups are inside a trial
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "preempted.log").read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    wait_process(proc, 60)
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [F, F, W, W], [t.state for t in study.trials]
    assert exit_statuses(tmp_path).get(0) == 143, exit_lines(tmp_path)
    log = (tmp_path / "preempted.log").read_text()
    assert "marked FAIL (SIGTERM); re-queued" in log, log[-3000:]
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "sleep_s=0.2",
              "hydra.sweeper.retry_failed_trials=1", "hydra.sweeper.plots=false").check()
    study = load(tmp_path)
    # the two closed trials do not count (their retries replace them): 4 COMPLETE, the retries first
    assert [t.state for t in study.trials] == [F, F, C, C, C, C]
    assert sorted(t.params["x"] for t in study.trials[2:4]) == sorted(t.params["x"] for t in study.trials[:2])


def test_refit_runs_are_spread_over_the_groups(tmp_path):
    """With refit on, the refit runs start once both groups' searches are over and are handed to whichever
    group is free: two refit runs with two groups run on both groups, one results file lists both."""
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "sleep_s=1",
              "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.trials=[0,1]",
              "hydra.sweeper.refit.overrides=['label=final']", "hydra.sweeper.plots=false").check()
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert sorted(r["trial"] for r in results["refit"]) == [0, 1]
    assert all(r["state"] == "COMPLETE" for r in results["refit"])
    ranks = {}
    for number in (0, 1):
        recs = [json.loads(f.read_text()) for f in (tmp_path / "records").glob(f"trial{number}_rank*.json")]
        finals = [r for r in recs if r["config"]["label"] == "final"]
        assert len(finals) == 1, recs  # each refit ran once, on one group's one rank
        ranks[number] = finals[0]["rank"]
    spans = {n: json.loads((tmp_path / "records" / f"span_trial{n}_rank{r}.json").read_text()) for n, r in ranks.items()}
    search_end = max(t.datetime_complete.timestamp() for t in load(tmp_path).trials)
    assert all(s["start"] >= search_end - 0.5 for s in spans.values()), (spans, search_end)
    assert sorted(ranks.values()) == [0, 1], ranks  # one refit run on each group (both were free)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_eight_groups_of_one_rank_on_the_default_storage_twenty_launches_in_a_row(tmp_path):
    """8 single-rank trial groups on the embedded default storage (SQLite in the sweep dir), 20 launches in a
    row of a trivial task resuming the same study, each adding one trial per group: no storage error in any
    launch (global rank 0 is the storage's one writer process), exactly 8 more COMPLETE trials each time, and
    every group ran trials (a group that is free first may take two of a launch's eight)."""
    for launch in range(1, 21):
        res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=8", f"hydra.sweeper.n_trials={8 * launch}",
                        "x=interval(-1,1)", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=120", nproc=8,
                        timeout_s=180)
        assert res.returncode == 0, res.output[-4000:]
        for bad in ("database is locked", "OperationalError", "StorageUnavailableError", "Traceback"):
            assert bad not in res.output, (launch, res.output[-4000:])
        study = load(tmp_path)
        assert [t.state for t in study.trials] == [C] * (8 * launch), launch
    assert sorted({t.user_attrs[GROUP] for t in study.trials}) == list(range(8))


def test_two_launches_with_trial_groups_share_one_postgres_study(tmp_path, pg_study):
    """Several launches share one study as several torchrun groups do: two launches of 2 ranks with
    ``n_jobs=2`` each (4 single-rank trial groups) on one PostgreSQL study. Every trial is COMPLETE and
    numbered once, every trial group of both launches ran trials (they meet at a start barrier), each
    launch tagged its trials with its own id, and the budget is overshot by at most one trial (one per
    extra launch: within a launch the asks are serialised)."""
    url, name = pg_study
    env = {"DSO_START_BARRIER_DIR": str(tmp_path / "start_barrier"), "DSO_START_BARRIER_N": "4"}
    launches = [shared._start(f"launch{i}", tmp_path, ["--standalone", "--nproc-per-node", "2"], [
        "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweeper.storage={url}", f"hydra.sweeper.study_name={name}",
        "hydra.sweeper.n_trials=8", "hydra.sweeper.n_jobs=2", "hydra.sweeper.rank_timeout=30", "sleep_s=0.5",
        "x=interval(-1,1)", "hydra.sweeper.plots=false"], env=env) for i in range(2)]
    shared._check_exit_zero(launches, shared._wait(launches, 180))
    trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    assert all(t.state == C for t in trials), [t.state for t in trials]
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert 8 <= len(trials) <= 9, len(trials)
    by_launch: dict[str, set[int]] = {}
    for t in trials:
        by_launch.setdefault(t.user_attrs[shared.GROUP_ATTR], set()).add(t.user_attrs[GROUP])
    assert len(by_launch) == 2 and all(groups == {0, 1} for groups in by_launch.values()), by_launch
