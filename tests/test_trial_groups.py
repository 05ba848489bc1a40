"""Unit tables for the split of a torchrun world into trial groups (``hydra.sweeper.n_jobs`` under torchrun).

The rules checked here against values written out by hand (not computed by the code under test): which
``n_jobs`` divide a world without a group straddling nodes unevenly, the variables each rank sees inside
its group (torch.distributed.run's names), and the GPUs of a group on its node.
"""

from __future__ import annotations

import pytest

from hydra_plugins.ds_optuna_sweeper import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._loop._trial_groups import group_devices, plan_groups, valid_group_counts
from hydra_plugins.ds_optuna_sweeper._settings import Settings


@pytest.mark.parametrize("world, per_node, expected", [
    (8, 8, [1, 2, 4, 8]),
    (2, 2, [1, 2]),
    (6, 6, [1, 2, 3, 6]),
    (16, 8, [1, 2, 4, 8, 16]),   # 2 nodes of 8: groups of 16, 8 (a node each), 4, 2, 1
    (12, 4, [1, 3, 6, 12]),      # 3 nodes of 4: groups of 12 (3 nodes), 4, 2, 1; 6 ranks would straddle
])
def test_valid_group_counts(world, per_node, expected):
    assert valid_group_counts(world, per_node) == expected


def test_a_count_that_does_not_divide_the_world_is_refused_naming_what_works():
    with pytest.raises(SweeperConfigError) as e:
        plan_groups(3, 8, 8)
    text = str(e.value)
    assert "n_jobs=3 does not divide the torchrun world of 8 ranks" in text
    assert "1 (8 ranks a trial), 2 (4 ranks a trial), 4 (2 ranks a trial), 8 (1 rank a trial)" in text


def test_a_group_that_would_straddle_nodes_unevenly_is_refused():
    with pytest.raises(SweeperConfigError, match="trial groups of 6 ranks, which would straddle nodes of 4 ranks"):
        plan_groups(2, 12, 4)


@pytest.mark.parametrize("rank, local_rank, expected", [
    # 8 ranks on one node, 4 groups of 2
    (0, 0, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}),
    (3, 3, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}),
    (6, 6, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}),
])
def test_group_env_inside_one_node(rank, local_rank, expected):
    env = plan_groups(4, 8, 8).group_env(rank, local_rank)
    assert {k: env[k] for k in expected} == expected
    assert env["ROLE_RANK"] == expected["RANK"] and env["ROLE_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "1"


def test_group_env_of_whole_nodes():
    """4 nodes of 2 ranks, 2 groups of 4 ranks (2 nodes each): global rank 5 is node 2's second rank,
    the second rank of the second node of group 1."""
    layout = plan_groups(2, 8, 2)
    assert layout.group_of(5) == 1
    env = layout.group_env(5, 1)
    assert env == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                   "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "4"}
    env = layout.group_env(6, 0)
    assert (env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"]) == ("2", "1", "0")


def test_group_devices():
    layout = plan_groups(4, 8, 8)
    assert layout.node_local_ranks(5, 5) == [4, 5]
    assert group_devices([str(i) for i in range(8)], [4, 5]) == ["4", "5"]
    assert group_devices(["3", "5", "6", "7"], [2, 3]) == ["6", "7"]   # a launch that saw 4 of the GPUs
    assert group_devices(["0"], [2, 3]) == ["0"]                        # fewer GPUs than ranks: shared, once
    assert group_devices(["GPU-a", "GPU-b"], [0, 1]) == ["GPU-a", "GPU-b"]
    assert group_devices([], [0, 1]) == []


def test_settings_groups_and_batch():
    """``n_jobs`` keeps its official meaning at world size 1 (a launcher batch) and means trial groups inside
    a torchrun world."""
    base = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}
    alone = Settings.from_node({**base, "n_jobs": 2}, world_size=1)
    assert (alone.batch, alone.trial_groups) == (2, 1)
    world = Settings.from_node({**base, "n_jobs": 2}, world_size=4, local_world_size=4)
    assert (world.batch, world.trial_groups) == (1, 2)
    with pytest.raises(SweeperConfigError, match="n_jobs=3 does not divide the torchrun world of 4 ranks"):
        Settings.from_node({**base, "n_jobs": 3}, world_size=4, local_world_size=4)


def test_rank_label_names_the_trial_group_only_inside_one(monkeypatch):
    """Inside a trial group ranks are the group's (both processes of 2 ranks with n_jobs=2 are rank 0/1), so
    messages add the group (new-user trial: 'rank 0/1' twice in one launch's output)."""
    from hydra_plugins.ds_optuna_sweeper._comm._whoami import TRIAL_GROUP_ENV, rank_label

    monkeypatch.delenv(TRIAL_GROUP_ENV, raising=False)
    assert rank_label(1, 2) == "rank 1/2"
    monkeypatch.setenv(TRIAL_GROUP_ENV, "1/4")
    assert rank_label(0, 2) == "rank 0/2 of trial group 1/4"


def test_end_of_search_summary_says_finished_only_when_every_group_finished():
    """One line once every group left; a stop's reason is cut before its resume command, which was logged in
    full where the stop happened (new-user trial: the line said 'Sweep finished' for a failure-rate stop and
    held the resume command twice)."""
    from hydra_plugins.ds_optuna_sweeper._loop._study_handles import _groups_summary

    assert _groups_summary({0: "finished the sweep", 1: "finished the sweep"}) == (
        "Sweep finished: every trial group is done (2 groups)")
    stop = ("stopped: TrialFailedError: 1 of 1 trials of this run failed (failure rate 1.00 > "
            "hydra.sweeper.max_failure_rate=0.0); see the errors logged above. The study keeps every trial, and "
            "failed ones count against hydra.sweeper.n_trials=4 (raise it to run as many new ones); fix the cause "
            "(in the task, its config or this command's overrides) and resume with: "
            "torchrun --standalone --nproc_per_node 2 app.py -m")
    assert _groups_summary({1: "finished the sweep", 0: stop}) == (
        "Sweep ended: every trial group has stopped (group 0: stopped: TrialFailedError: 1 of 1 trials of this run "
        "failed (failure rate 1.00 > hydra.sweeper.max_failure_rate=0.0); see the errors logged above; group 1: "
        "finished the sweep)")
