"""Tables for ``_setting_values.py`` (issue 39 item 4: rows that kill its mutants).

One row per accepted value (what ``Settings`` keeps) and per refusal (the exact text: the key, the bad value and
the fix), from the functions' docstrings: Optuna's RDBStorage heartbeat rules (case C20, optuna/optuna#5470),
torch.distributed's backend names, the refit and baseline rules (docs/how-to/refit.md, "Refit").
"""

import warnings

import pytest
import torch.distributed as dist
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._setting_values import (
    check_backend,
    check_budget,
    check_enqueue_trials,
    check_heartbeat,
    check_keep_best,
    check_limits,
    check_preempt_grace,
    check_pruner,
    check_refit,
    check_refit_baselines,
    check_repeats,
    check_retry_count,
    check_storage_retry,
    normalize_directions,
)


def N(**keys):
    return OmegaConf.create(keys)


def _refused(call, message):
    with pytest.raises(SweeperConfigError) as err:
        call()
    assert str(err.value) == message


class _Direction:
    name = "MAXIMIZE"  # optuna.study.StudyDirection: read by name


@pytest.mark.parametrize("direction, directions", [
    ("minimize", ("minimize",)), ("MAXIMIZE", ("maximize",)), (["maximize", "Minimize"], ("maximize", "minimize")),
    (("minimize",), ("minimize",)), (OmegaConf.create(["maximize"]), ("maximize",)), (_Direction(), ("maximize",)),
])
def test_normalize_directions(direction, directions):
    assert normalize_directions(direction) == directions


@pytest.mark.parametrize("direction, message", [
    ("min", "hydra.sweeper.direction must be 'minimize' or 'maximize' (or a list of them), got 'min'"),
    (["minimize", "up"], "hydra.sweeper.direction must be 'minimize' or 'maximize' (or a list of them), got "
                         "['minimize', 'up']"),
    ([], "hydra.sweeper.direction is an empty list; give at least one direction"),
])
def test_normalize_directions_refuses(direction, message):
    _refused(lambda: normalize_directions(direction), message)


@pytest.mark.parametrize("n_jobs, n_trials, world, local, expected", [
    (1, 20, 1, None, (1, 20)), (4, 0, 1, None, (4, 0)), (2, 5, 4, 2, (2, 5)), (3, 5, 1, None, (3, 5)),
    (1, 5, 3, None, (1, 5)),
])
def test_check_budget(n_jobs, n_trials, world, local, expected):
    assert check_budget(N(n_jobs=n_jobs, n_trials=n_trials), world, local) == expected


@pytest.mark.parametrize("n_jobs, n_trials, world, message", [
    (0, 5, 1, "hydra.sweeper.n_jobs must be >= 1, got n_jobs=0"),
    (1, -1, 1, "hydra.sweeper.n_trials must be >= 0, got n_trials=-1"),
    (3, 5, 4, "hydra.sweeper.n_jobs=3 does not divide the torchrun world of 4 ranks into trial groups of equal "
              "size; use one of: 1 (4 ranks a trial), 2 (2 ranks a trial), 4 (1 rank a trial). Nothing was started."),
    (3, 5, 2, "hydra.sweeper.n_jobs=3 does not divide the torchrun world of 2 ranks into trial groups of equal "
              "size; use one of: 1 (2 ranks a trial), 2 (1 rank a trial). Nothing was started."),
    (2, 5, 3, "hydra.sweeper.n_jobs=2 does not divide the torchrun world of 3 ranks into trial groups of equal "
              "size; use one of: 1 (3 ranks a trial), 3 (1 rank a trial). Nothing was started."),
])
def test_check_budget_refuses(n_jobs, n_trials, world, message):
    _refused(lambda: check_budget(N(n_jobs=n_jobs, n_trials=n_trials), world), message)


def test_check_budget_reads_the_nodes():
    assert check_budget(N(n_jobs=3, n_trials=5), 6) == (3, 5)  # one node of 6
    _refused(lambda: check_budget(N(n_jobs=3, n_trials=5), 6, 3),
             "hydra.sweeper.n_jobs=3 makes trial groups of 2 ranks, which would straddle nodes of 3 ranks unevenly (a "
             "group must fit in one node or be made of whole nodes); use one of: 1 (6 ranks a trial), 2 (3 ranks a "
             "trial), 6 (1 rank a trial). Nothing was started.")


@pytest.mark.parametrize("rate, timeout, rank_timeout, expected", [
    (0.0, None, 600, (0.0, None, 600.0)), (1.0, 0.5, 0.1, (1.0, 0.5, 0.1)), (0.5, 30, 1, (0.5, 30.0, 1.0)),
])
def test_check_limits(rate, timeout, rank_timeout, expected):
    got = check_limits(N(max_failure_rate=rate, timeout=timeout, rank_timeout=rank_timeout))
    assert got == expected and [type(v) for v in got] == [type(v) for v in expected]


@pytest.mark.parametrize("rate, timeout, rank_timeout, message", [
    (-0.1, None, 600, "hydra.sweeper.max_failure_rate must be within [0, 1], got max_failure_rate=-0.1"),
    (1.5, None, 600, "hydra.sweeper.max_failure_rate must be within [0, 1], got max_failure_rate=1.5"),
    (0.0, 0, 600, "hydra.sweeper.timeout must be > 0 seconds or null, got timeout=0.0"),
    (0.0, -5, 600, "hydra.sweeper.timeout must be > 0 seconds or null, got timeout=-5.0"),
    (0.0, None, 0, "hydra.sweeper.rank_timeout must be > 0 seconds, got timeout_s=0.0"),
    (0.0, None, None, "hydra.sweeper.rank_timeout must be > 0 seconds, got timeout_s=0.0"),
])
def test_check_limits_refuses(rate, timeout, rank_timeout, message):
    _refused(lambda: check_limits(N(max_failure_rate=rate, timeout=timeout, rank_timeout=rank_timeout)), message)


@pytest.mark.parametrize("repeats, seed_key, seeds, expected", [
    (1, None, None, (1, (0,))), (3, "seed", None, (3, (0, 1, 2))), (2, "t.seed", [7, "9"], (2, (7, 9))),
    (1, None, [5], (1, (5,))),
])
def test_check_repeats(repeats, seed_key, seeds, expected):
    assert check_repeats(N(repeats=repeats, seed_key=seed_key, seeds=seeds)) == expected


@pytest.mark.parametrize("repeats, seed_key, seeds, message", [
    (0, "s", None, "hydra.sweeper.repeats must be >= 1, got repeats=0"),
    (2, None, None, "hydra.sweeper.repeats=2 needs hydra.sweeper.seed_key: the config key that takes each repeat's "
                    "seed (e.g. training.seed)"),
    (2, "", None, "hydra.sweeper.repeats=2 needs hydra.sweeper.seed_key: the config key that takes each repeat's "
                  "seed (e.g. training.seed)"),
    (2, "s", [1], "hydra.sweeper.seeds has 1 seed(s) but repeats=2; give one per repeat"),
    (1, None, [1, 2], "hydra.sweeper.seeds has 2 seed(s) but repeats=1; give one per repeat"),
])
def test_check_repeats_refuses(repeats, seed_key, seeds, message):
    _refused(lambda: check_repeats(N(repeats=repeats, seed_key=seed_key, seeds=seeds)), message)


@pytest.mark.parametrize("pruner, directions, message", [
    ({"_target_": "optuna.pruners.MedianPruner"}, ("minimize",), None),
    ({"_target_": "optuna.pruners.NopPruner"}, ("minimize", "maximize"), None),
    ({"_target_": "optuna.pruners.MedianPruner"}, ("minimize", "maximize"),
     "hydra.sweeper.pruner (optuna.pruners.MedianPruner) with 2 objectives: Optuna's pruners need one intermediate "
     "value per step, and Trial.report is not supported for multi-objective studies. Use hydra/sweeper/pruner=nop, "
     "or one direction."),
    (None, ("minimize", "maximize", "minimize"),
     "hydra.sweeper.pruner () with 3 objectives: Optuna's pruners need one intermediate value per step, and "
     "Trial.report is not supported for multi-objective studies. Use hydra/sweeper/pruner=nop, or one direction."),
    ({"n_startup_trials": 1}, ("minimize", "maximize"),
     "hydra.sweeper.pruner () with 2 objectives: Optuna's pruners need one intermediate value per step, and "
     "Trial.report is not supported for multi-objective studies. Use hydra/sweeper/pruner=nop, or one direction."),
])
def test_check_pruner(pruner, directions, message):
    if message is None:
        check_pruner(N(pruner=pruner), directions)
    else:
        _refused(lambda: check_pruner(N(pruner=pruner), directions), message)


KNOWN = [b for b in dist.Backend.backend_list if b != "undefined"]


@pytest.mark.parametrize("backend, unknown", [
    (None, None), ("gloo", None), ("GLOO", None), ("cpu:gloo,cuda:nccl", None), (" cpu : gloo , cuda:nccl", None),
    ("glo", ["glo"]), ("cpu:gloo,cuda:nccll", ["nccll"]), ("undefined", ["undefined"]), ("", [""]),
    ("cpu:x:gloo", ["x:gloo"]),                 # the backend is what follows the first ':' 
])
def test_check_backend(backend, unknown):
    if unknown is None:
        check_backend(backend)
    else:
        _refused(lambda: check_backend(backend),
                 f"hydra.sweeper.backend={backend!r}: unknown torch.distributed backend {unknown}; use one of {KNOWN} "
                 "or device:backend pairs such as 'cpu:gloo,cuda:nccl', or null for the automatic choice")


def _refit(trials=("best",), enabled=True, baselines=None):
    return N(refit={"trials": list(trials), "enabled": enabled, "baselines": baselines})


@pytest.mark.parametrize("node, directions, trials", [
    (_refit(), ("minimize",), ("best",)),
    (_refit(["enqueued", 0, 12]), ("minimize", "maximize"), ("enqueued", 0, 12)),
    (_refit(["best"], enabled=False), ("minimize", "maximize"), ("best",)),   # not enabled: best is not refused
    (_refit([], baselines={"b": {}}), ("minimize",), ()),
    (_refit([], enabled=False), ("minimize",), ()),
    (N(refit={"trials": ["${n}", "best"], "enabled": True, "baselines": None}, n=3), ("minimize",), (3, "best")),
])
def test_check_refit(node, directions, trials):
    assert check_refit(node, directions) == trials


@pytest.mark.parametrize("node, directions, message", [
    (_refit(["worst"]), ("minimize",), "hydra.sweeper.refit.trials has 'worst'; give 'best', 'enqueued' or trial "
                                       "numbers (e.g. [best, enqueued])"),
    (_refit(["best", 2, "worst"]), ("minimize",), "hydra.sweeper.refit.trials has 'worst'; give 'best', 'enqueued' "
                                                  "or trial numbers (e.g. [best, enqueued])"),
    (_refit([-1]), ("minimize",), "hydra.sweeper.refit.trials has -1; give 'best', 'enqueued' or trial numbers "
                                  "(e.g. [best, enqueued])"),
    (_refit([True]), ("minimize",), "hydra.sweeper.refit.trials has True; give 'best', 'enqueued' or trial numbers "
                                    "(e.g. [best, enqueued])"),
    (_refit([1.0]), ("minimize",), "hydra.sweeper.refit.trials has 1.0; give 'best', 'enqueued' or trial numbers "
                                   "(e.g. [best, enqueued])"),
    (_refit([]), ("minimize",), "hydra.sweeper.refit.enabled=true with an empty refit.trials and no "
                                "refit.baselines: name what to refit"),
    (_refit(["best", 3]), ("minimize", "maximize"),
     "hydra.sweeper.refit.trials has 'best', but the study has 2 objectives and no single best trial: name the "
     "trials to refit by number (see pareto_front in optimization_results.yaml), e.g. hydra.sweeper.refit.trials=[3,7]"),
])
def test_check_refit_refuses(node, directions, message):
    _refused(lambda: check_refit(node, directions), message)


@pytest.mark.parametrize("baselines, expected", [
    (None, ()),
    ({}, ()),
    ({"defaults": {"training.lr": 5e-5, "+x.y": "a b"}, "_b-1.v": {}},
     (("defaults", ("training.lr=5e-05", "+x.y=a b")), ("_b-1.v", ()))),
    ({"a1": {"++g@p/q-r": 1}}, (("a1", ("++g@p/q-r=1",)),)),
    ({"Base_Z": {"lr": "${x}"}}, (("Base_Z", ("lr=0.5",)),)),     # upper case; interpolations resolved
])
def test_check_refit_baselines(baselines, expected):
    assert check_refit_baselines(N(refit={"baselines": baselines}, x=0.5)) == expected


def _name_message(name):
    return (f"hydra.sweeper.refit.baselines has the name {name!r}: use letters, digits, '_', '-' or '.', starting "
            "with a letter, digit or '_', not only digits (it names the refit dir refit/<name>, next to the trials' "
            "refit/<number>)")


def _entry_message(name, entry):
    return (f"hydra.sweeper.refit.baselines.{name} must be a mapping of config keys to values (an empty mapping is "
            f"the config as composed), got {entry!r}; to drop it: ~hydra.sweeper.refit.baselines.{name}")


@pytest.mark.parametrize("baselines, message", [
    (["a"], "hydra.sweeper.refit.baselines must map names to {config key: value}, got ['a']; e.g. "
            "hydra.sweeper.refit.baselines={defaults:{training.learning_rate:5e-5}}"),
    ({"12": {}}, _name_message("12")),
    ({".x": {}}, _name_message(".x")),
    ({"-x": {}}, _name_message("-x")),
    ({"a b": {}}, _name_message("a b")),
    ({"a/b": {}}, _name_message("a/b")),
    ({"": {}}, _name_message("")),
    ({"ok": ["lr=1"]}, _entry_message("ok", ["lr=1"])),
    ({"ok": {"lr=1": 2}}, _entry_message("ok", {"lr=1": 2})),
    ({"ok": {"+++x": 2}}, _entry_message("ok", {"+++x": 2})),
    ({"ok": {"a b": 2}}, _entry_message("ok", {"a b": 2})),
])
def test_check_refit_baselines_refuses(baselines, message):
    _refused(lambda: check_refit_baselines(N(refit={"baselines": baselines})), message)


@pytest.mark.parametrize("interval, grace, expected, warns", [
    (60, None, (60, None), False), (None, None, (None, None), False), (None, 10, (None, 10), False),
    (10, 20, (10, 20), False), (10, 100, (10, 100), False), (10, 19, (10, 19), True), (10, 11, (10, 11), True),
    (1, 2, (1, 2), False), (None, 1, (None, 1), False), (1, None, (1, None), False),  # 1 s is positive
])
def test_check_heartbeat(interval, grace, expected, warns):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert check_heartbeat(N(heartbeat_interval=interval, grace_period=grace)) == expected
    texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    assert texts == ([f"hydra.sweeper.grace_period={grace} s is below 2 x heartbeat_interval={interval} s (Optuna's "
                      "default): a slow database write can let a live trial look stale. Set grace_period null to "
                      "silence this."] if warns else [])


@pytest.mark.parametrize("interval, grace, message", [
    (0, None, "hydra.sweeper.heartbeat_interval must be a positive number of seconds or null (off), got 0"),
    (-1, None, "hydra.sweeper.heartbeat_interval must be a positive number of seconds or null (off), got -1"),
    (None, 0, "hydra.sweeper.grace_period must be a positive number of seconds or null, got 0"),
    (10, 10, "hydra.sweeper.grace_period=10 s is not longer than hydra.sweeper.heartbeat_interval=10 s: a running "
             "trial records a heartbeat every heartbeat_interval seconds, and any worker fails a trial whose last "
             "heartbeat is older than grace_period, so healthy trials would be failed between two heartbeats "
             "(optuna/optuna#5470). Use grace_period >= 20 (Optuna's default is 2 x heartbeat_interval), or leave it "
             "null."),
    (30, 5, "hydra.sweeper.grace_period=5 s is not longer than hydra.sweeper.heartbeat_interval=30 s: a running "
            "trial records a heartbeat every heartbeat_interval seconds, and any worker fails a trial whose last "
            "heartbeat is older than grace_period, so healthy trials would be failed between two heartbeats "
            "(optuna/optuna#5470). Use grace_period >= 60 (Optuna's default is 2 x heartbeat_interval), or leave it "
            "null."),
])
def test_check_heartbeat_refuses(interval, grace, message):
    _refused(lambda: check_heartbeat(N(heartbeat_interval=interval, grace_period=grace)), message)


@pytest.mark.parametrize("retry, message", [
    (0, None), (3, None), (-1, "hydra.sweeper.retry_failed_trials must be >= 0, got -1"),
])
def test_check_retry_count(retry, message):
    if message is None:
        assert check_retry_count(N(retry_failed_trials=retry)) == retry
    else:
        _refused(lambda: check_retry_count(N(retry_failed_trials=retry)), message)


@pytest.mark.parametrize("keep, message", [
    (-1, None), (0, None), (5, None),
    (-2, "hydra.sweeper.checkpoints.keep_best must be >= 0, or -1 to keep every finished trial's checkpoint; got -2"),
])
def test_check_keep_best(keep, message):
    if message is None:
        assert check_keep_best(N(checkpoints={"keep_best": keep})) == keep
    else:
        _refused(lambda: check_keep_best(N(checkpoints={"keep_best": keep})), message)


@pytest.mark.parametrize("grace, message", [
    (15, None), (0.5, None),
    (0, "hydra.sweeper.checkpoints.preempt_grace must be > 0 seconds, got 0"),
    (-2.5, "hydra.sweeper.checkpoints.preempt_grace must be > 0 seconds, got -2.5"),
    (float("nan"), "hydra.sweeper.checkpoints.preempt_grace must be > 0 seconds, got nan"),
])
def test_check_preempt_grace(grace, message):
    if message is None:
        got = check_preempt_grace(N(checkpoints={"preempt_grace": grace}))
        assert got == float(grace) and type(got) is float
    else:
        _refused(lambda: check_preempt_grace(N(checkpoints={"preempt_grace": grace})), message)


@pytest.mark.parametrize("retry, message", [
    (0, None), (120, None), (0.5, None),
    (-1, "hydra.sweeper.storage_retry_timeout must be >= 0 seconds (0: no retry), got -1"),
    (None, "hydra.sweeper.storage_retry_timeout must be >= 0 seconds (0: no retry), got None"),
])
def test_check_storage_retry(retry, message):
    if message is None:
        got = check_storage_retry(N(storage_retry_timeout=retry))
        assert got == float(retry) and type(got) is float
    else:
        _refused(lambda: check_storage_retry(N(storage_retry_timeout=retry)), message)


@pytest.mark.parametrize("enqueue, expected", [
    (None, ()), ([], ()), ([{"lr": 0.1}, {"lr": "${y}", "x": 2}], ({"lr": 0.1}, {"lr": 3, "x": 2})),  # resolved
])
def test_check_enqueue_trials(enqueue, expected):
    assert check_enqueue_trials(N(enqueue_trials=enqueue, y=3)) == expected


@pytest.mark.parametrize("enqueue, message", [
    ([{"lr": 0.1}, {}], "hydra.sweeper.enqueue_trials[1] must be a non-empty mapping, got {}"),
    ([0.1], "hydra.sweeper.enqueue_trials[0] must be a non-empty mapping, got 0.1"),
])
def test_check_enqueue_trials_refuses(enqueue, message):
    _refused(lambda: check_enqueue_trials(N(enqueue_trials=enqueue)), message)
