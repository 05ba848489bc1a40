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

import pytest
import yaml
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import exit_lines, exit_statuses, load, records, run_sweep
from tests.tracking_readers import mlflow_runs
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


@pytest.mark.soak  # the lean net's 12 min; make test keeps the 4-rank groups (below)
def test_two_single_rank_groups_run_trials_at_once_and_one_groups_failures_leave_the_other_running(tmp_path):
    """2 ranks, ``n_jobs=2``: two single-rank trial groups run their trials side by side (the spans of trials
    of different groups overlap), each task sees a world of one (``WORLD_SIZE=1``,
    ``dist.get_world_size() == 1``) and its group (``DS_OPTUNA_TRIAL_GROUP``). Group 1's task raises in every
    trial (``fail_on_rank=1``, its only rank): each of its trials is told FAIL, group 0 goes on completing its
    own, the budget is exact (``n_trials=7`` gives 7 trials), nothing stays RUNNING, there is one results file
    and every rank exits 0. Tracking (issue 25): global rank 0 writes one MLflow run per trial, tagged with the
    group that ran it and its state; each trial's task gets its run's environment."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=7", "x=interval(-1,1)", "sleep_s=1.5",
                    "fail_on_rank=1", "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.tracking.report_to=[mlflow]",
                    "hydra.sweeper.plots=false").check()
    study = load(tmp_path)
    groups = _groups(study)
    assert set(groups.values()) == {0, 1}, groups
    assert len(study.trials) == 7
    for t in study.trials:
        assert t.state == (F if groups[t.number] == 1 else C), (t.number, t.state, groups[t.number])
    recs = records(tmp_path)
    assert {number for number, _ in recs} == set(range(7))
    for (number, rank), rec in recs.items():
        assert rank == groups[number], (number, rank)  # global rank g is trial group g's one rank
        assert rec["env"]["WORLD_SIZE"] == "1" and rec["env"]["RANK"] == "0" and rec["env"]["LOCAL_RANK"] == "0"
        assert rec["dist_world_size"] == 1 and rec["dist_rank"] == 0
        assert rec["env"]["DS_OPTUNA_TRIAL_GROUP"] == f"{groups[number]}/2"  # the task can tell its group
        assert rec["tracking_env"]["MLFLOW_EXPERIMENT_NAME"] == "sweep_app", (number, rank)
    spans = _spans(tmp_path)
    # Side by side: every trial of group 1 but one (the sweep's last may run alone) overlaps one of group 0's.
    # (Group 1's first trial starts seconds after group 0's: global rank 0 opens MLflow first.)
    alone = [b for b in spans if groups[b] == 1 and not any(
        groups[a] == 0 and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1] for a in spans)]
    ones = [b for b in spans if groups[b] == 1]
    assert ones and len(alone) <= 1 and len(alone) < len(ones), (spans, groups)
    # group 1's rank names its group (both processes are "rank 0/1" of their own world), and rank 0 ends with one
    # summary line
    assert re.search(r"rank 0/1 of trial group 1/2 runs trial \d+ with params", res.output), res.output[-3000:]
    assert "Sweep finished: every trial group is done (2 groups)" in res.output, res.output[-3000:]
    assert "(group 1) FAIL" in res.output and "injected failure on rank 1" in res.output
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    failed = sum(g == 1 for g in groups.values())
    assert results["trials_in_study"] == 7 and results["states"] == {"COMPLETE": 7 - failed, "FAIL": failed}
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()) == list(range(7))
    runs = {int(r.data.tags["ds_optuna.trial"]): r for r in mlflow_runs(f"sqlite:///{tmp_path / 'sweep'}/mlflow.db",
                                                                         "sweep_app")
            if r.data.tags.get("ds_optuna.kind") != "study"}
    assert sorted(runs) == list(range(7))
    for t in study.trials:
        run = runs[t.number]
        assert run.data.tags["ds_optuna.trial_group"] == str(groups[t.number])
        assert run.data.tags["ds_optuna.state"] == t.state.name
        assert run.info.status == ("FINISHED" if t.state == C else "FAILED"), (t.number, run.info.status)
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)


def test_two_groups_of_two_ranks_agree_within_each_group(tmp_path):
    """THE trial-groups contract. 4 ranks, ``n_jobs=2``: two 2-rank trials at once, each with the
    rank-consistent calls (``report``, ``should_prune`` through global rank 0's service for group 1) and
    training collectives on its own default group; both ranks of a trial compose the same config, see a world of
    2 and their group, and the median pruner (which sees every step both groups report) prunes later, worse
    trials on both ranks of their group at the same step; no step is lost or stored twice; one summary line, one
    results file, one job dir per trial, every rank exits 0."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=6", "x=interval(-1,1)",
                    "steps=4", "collectives=2", "sleep_s=0.5", "hydra/sweeper/pruner=median",
                    "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=0",
                    "hydra.sweeper.plots=false", nproc=4, timeout_s=240,
                    # every rank's first trial waits for all 4 (tests/apps/start_barrier.py): a group 1 whose first
                    # ask lags (under load, past group 0's 1-s trial) still overlaps, and groups run one after the
                    # other would never pass the barrier
                    env={"DSO_START_BARRIER_DIR": str(tmp_path / "start_barrier"), "DSO_START_BARRIER_N": "4"}
                    ).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert len(states) == 6 and set(states) <= {C, P}, states
    assert P in states, states  # the app's objective grows with the trial number: later trials are pruned
    groups = _groups(study)
    assert set(groups.values()) == {0, 1}, groups
    recs = records(tmp_path)
    for t in study.trials:
        steps = sorted(t.intermediate_values)
        assert steps == list(range(len(steps))) and steps, (t.number, steps)  # no step lost or stored twice
        if t.state == C:
            assert steps == [0, 1, 2, 3], (t.number, steps)
        group = groups[t.number]
        pair = [recs[(t.number, 2 * group + r)] for r in range(2)]  # global ranks 2g, 2g+1
        assert [p["env"]["RANK"] for p in pair] == ["0", "1"] and {p["env"]["WORLD_SIZE"] for p in pair} == {"2"}
        assert {p["dist_world_size"] for p in pair} == {2}
        assert {p["env"]["DS_OPTUNA_TRIAL_GROUP"] for p in pair} == {f"{group}/2"}
        assert pair[0]["config_hash"] == pair[1]["config_hash"]
        assert pair[0]["env"]["MASTER_PORT"] == pair[1]["env"]["MASTER_PORT"]  # the group's own store
        if t.state == P:  # both ranks of the group stopped at the step the pruner answered
            for r in range(2):
                pruned_at = json.loads((tmp_path / "records" / f"pruned_trial{t.number}_rank{2 * group + r}.json")
                                       .read_text())
                assert pruned_at["step"] == steps[-1], (t.number, r, pruned_at, steps)
    ports = {recs[(n, 2 * g)]["env"]["MASTER_PORT"] for n, g in groups.items()}
    assert len(ports) == 2, ports  # one store per trial group
    spans = _spans(tmp_path)  # written by completed trials only
    assert any(groups[a] == 0 and groups[b] == 1 and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
               for a in spans for b in spans), (spans, groups)  # the two startup trials ran at once
    assert re.search(r"\[\d/6\] Trial \d \(group 1\) (COMPLETE|PRUNED)", res.output), res.output[-3000:]
    assert "Sweep finished: every trial group is done (2 groups)" in res.output, res.output[-3000:]
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert results["trials_in_study"] == 6
    assert results["states"] == {s.name: states.count(s) for s in (C, P) if s in states}
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()) == list(range(6))
    assert exit_statuses(tmp_path) == {r: 0 for r in range(4)}, exit_lines(tmp_path)


@pytest.mark.soak  # the lean net's 12 min; make test keeps the 4-rank groups (above)
def test_sigterm_closes_every_groups_running_trial_says_it_once_and_the_resume_refits_on_both_groups(tmp_path):
    """SIGTERM to torchrun while both groups run a trial: global rank 0 closes both (re-queued with
    ``retry_failed_trials=1``) and exits 143 before the other group's first rank (SIGTERM's default action) is
    waited for; "received SIGTERM" and the resume command are said once (issue 38, C59: every rank of a trial
    group is its group's rank 0, and each used to say it); the same command resumes and runs the re-queued
    trials first."""
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
    received = [ln for ln in log.splitlines() if "received SIGTERM" in ln]
    assert len(received) == 1, "\n".join(received) + "\n----\n" + log[-5000:]
    resume = [ln for ln in log.splitlines() if f"hydra.sweep.dir={tmp_path / 'sweep'}" in ln and "sweep_app.py" in ln]
    assert len(resume) == 1, "\n".join(resume) + "\n----\n" + log[-5000:]
    # The resume also refits (refit on, two runs): the refit runs start once both groups' searches are over and
    # are handed to whichever group is free: two refit runs with two groups run on both groups, one results
    # file lists both.
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "sleep_s=1",
              "hydra.sweeper.retry_failed_trials=1", "hydra.sweeper.refit.enabled=true",
              "hydra.sweeper.refit.trials=[2,3]", "hydra.sweeper.refit.overrides=['label=final']",
              "hydra.sweeper.plots=false").check()
    study = load(tmp_path)
    # the two closed trials do not count (their retries replace them): 4 COMPLETE, the retries first
    assert [t.state for t in study.trials] == [F, F, C, C, C, C]
    assert sorted(t.params["x"] for t in study.trials[2:4]) == sorted(t.params["x"] for t in study.trials[:2])
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert sorted(r["trial"] for r in results["refit"]) == [2, 3]
    assert all(r["state"] == "COMPLETE" for r in results["refit"])
    ranks = {}
    for number in (2, 3):
        recs = [json.loads(f.read_text()) for f in (tmp_path / "records").glob(f"trial{number}_rank*.json")]
        finals = [r for r in recs if r["config"]["label"] == "final"]
        assert len(finals) == 1, recs  # each refit ran once, on one group's one rank
        ranks[number] = finals[0]["rank"]
    spans = {n: json.loads((tmp_path / "records" / f"span_trial{n}_rank{r}.json").read_text()) for n, r in ranks.items()}
    search_end = max(t.datetime_complete.timestamp() for t in study.trials if t.state == C)
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
