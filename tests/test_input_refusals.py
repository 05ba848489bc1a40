"""Cases a new user ran into (C33, C37, C43, C44; docs/cases.md): each refused before
anything runs with a message that names the fix, or accepted with the promised value.

Real parts: Hydra's compose and config loader, Optuna in-memory studies, the sweeper's own settings and
search-space checks; the real command line of each case whose promise is about a real run, in process
(``tests/in_process.py``, world size 1: rank 0 alone refuses).
"""

import decimal
import json
import sys

import numpy as np
import optuna
import pytest
import torch

from hydra_plugins.ds_optuna_sweeper import SearchSpaceError, SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._loop._agree import objective_values, refit_metrics
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from hydra_plugins.ds_optuna_sweeper._study._space_checks import check_param_keys
from hydra_plugins.ds_optuna_sweeper._settings import Settings
from hydra_plugins.ds_optuna_sweeper._study._queue import enqueue_warm_starts, warm_start_params
from hydra_plugins.ds_optuna_sweeper.config import PRUNERS, SAMPLERS
from tests.hydra_config import composed_with_group_options
from tests.in_process import sweep
from tests.torchrun_utils import REPO

# --- C33: warm starts are cast to their distribution, or refused before trial 0 -----------------------

SPACE = {
    "x": "interval(0,1)",
    "n": "int(interval(1,8))",
    "r": "range(0,10,2)",
    "opt": "choice(a,b)",
    "bs": "choice(1,2)",
    "flag": "choice(true,false)",
    "s": "choice('1','2')",
    "lr": "tag(log, interval(1e-5,1e-3))",
}


@pytest.mark.parametrize(
    "name, given, expected",
    [
        ("x", "0.5", 0.5), ("x", 1, 1.0), ("lr", "1e-4", 1e-4),   # float: a number, or text that reads as one
        ("n", "3", 3), ("n", 4.0, 4), ("r", 4, 4),               # int: integral values
        ("opt", "a", "a"), ("bs", 1.0, 1), ("bs", "2", 2),       # choice: the choice's own typed value
        ("flag", "true", True), ("flag", False, False), ("s", 1, "1"),
    ],
)
def test_c33_warm_start_values_are_cast_to_their_distribution(name, given, expected):
    typed = warm_start_params(build_search_space(SPACE, []), [{name: given}])[0][name]
    assert typed == expected and type(typed) is type(expected)


@pytest.mark.parametrize(
    "name, given, why",
    [
        ("x", "abc", "is not a number"), ("x", True, "is not a number"), ("x", 2, "is outside its distribution"),
        ("x", float("nan"), "is outside its distribution"), ("lr", 0, "is outside its distribution"),
        ("n", 2.5, "is not an integer"), ("n", True, "is not a number"), ("r", 3, "is outside its distribution"),
        ("opt", "c", "is not one of the choices ['a', 'b']"), ("bs", True, "is not one of the choices [1, 2]"),
        ("flag", 1, "is not one of the choices [True, False]"),
    ],
)
def test_c33_a_warm_start_outside_its_distribution_is_refused_naming_param_distribution_and_fix(name, given, why):
    space = build_search_space(SPACE, [])
    with pytest.raises(SweeperConfigError) as e:
        warm_start_params(space, [{"x": 0.5}, {name: given}])
    text = str(e.value)
    spec = space.params[name]
    assert f"enqueue_trials[1]: {name}={given!r}" in text and why in text, text
    assert f"'{name}={spec.expression}'" in text and "Write a value of that distribution" in text, text
    assert "storage" not in text.lower(), text


def test_c33_the_trial_asked_from_a_warm_start_holds_the_typed_value():
    """Through a real Optuna study, as the driver asks (``ask(fixed_distributions=...)``): the params the
    task gets are the typed values the study records (Optuna hands back an enqueued value as given)."""
    space = build_search_space({"x": "interval(0,1)", "opt": "choice(1,2)"}, [])
    study = optuna.create_study()
    enqueue_warm_starts(study, ({"x": "0.5", "opt": "2"},), space)
    trial = study.ask(fixed_distributions=space.distributions())
    assert trial.params == {"x": 0.5, "opt": 2}
    assert type(trial.params["x"]) is float and type(trial.params["opt"]) is int
    assert space.overrides(trial.params) == ["x=0.5", "opt=2"]
    with pytest.raises(SweeperConfigError, match="not one of the choices"):
        enqueue_warm_starts(study, ({"opt": 3},), space)
    assert len(study.trials) == 1  # nothing more was queued


def test_c33_in_a_sweep_the_task_gets_the_float(tmp_path):
    """World size 1, the real command line, in process (``tests/in_process.py``). Before: the task got the
    string '0.5' while the study said 0.5."""
    sweep(tmp_path, "hydra.sweeper.n_trials=1", "x=interval(0,1)", "hydra.sweeper.enqueue_trials=[{x:'0.5'}]").check()
    record = json.loads((tmp_path / "records" / "trial0_rank0.json").read_text())
    assert record["config"]["x"] == 0.5 and record["types"]["x"] == "float"
    assert optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{tmp_path}/sweep/optuna.db").trials[0].params == {
        "x": 0.5}


#: Command lines refused before anything runs (world size 1, in process): the overrides, what the output must
#: say, and what it must not.
REFUSED_LINES = [
    # C33: a warm start outside the choices was reported as "Cannot open the Optuna storage"
    (["label=choice(a,b)", "hydra.sweeper.enqueue_trials=[{label:c}]"],
     "enqueue_trials[0]: label='c' is not one of the choices ['a', 'b'] (a str)", "Cannot open the Optuna storage"),
    # C43: a pruner chosen as a key
    (["hydra.sweeper.pruner=median", "x=interval(0,1)"],
     "choose it with hydra/sweeper/pruner=median (a slash, not a dot)", "AttributeError"),
    # C44: tests/apps/conf has a group 'optimizer' that app.yaml does not select: the typo names '+optimizer'
    # (the group is found through the sweeper's own config-loader listing), and the right name without '+'
    # (which Hydra refuses in every trial: "No match in the defaults list") is refused before trial 0
    (["optimzer=choice(adamw,sgd)"],
     "'optimzer' is not a key or config group of the task's config (did you mean '+optimizer'?)", "Traceback"),
    (["optimizer=choice(adamw,sgd)"],
     "'optimizer' is a config group that is not in the defaults list (write '+optimizer=...' to add it)",
     "Traceback"),
]


@pytest.mark.parametrize("overrides, said, unsaid", REFUSED_LINES, ids=["c33_choice", "c43_pruner_key",
                                                                      "c44_typo", "c44_outside_defaults"])
def test_a_refused_command_line_stops_before_anything_runs(tmp_path, overrides, said, unsaid):
    res = sweep(tmp_path, *overrides)
    assert res.returncode == 1 and said in res.output, res.output[-3000:]
    assert unsaid not in res.output, res.output[-3000:]
    assert not (tmp_path / "records").exists() and not (tmp_path / "sweep").exists()  # not even an empty sweep dir


# --- C37: objectives of the wrong type -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ret, n, expected",
    [
        (np.array([0.25, 0.5]), 2, (0.25, 0.5)), (torch.tensor([0.25, 0.5]), 2, (0.25, 0.5)),
        ([0.25, 0.5], 2, (0.25, 0.5)), ((0.25, 0.5), 2, (0.25, 0.5)), (np.array([0.25]), 1, (0.25,)),
        (np.float32(0.25), 1, (0.25,)), (np.array(0.25), 1, (0.25,)), (torch.tensor(0.25), 1, (0.25,)),
        (torch.tensor([0.25, 0.5], requires_grad=True), 2, (0.25, 0.5)), (np.int64(3), 1, (3.0,)),
        (decimal.Decimal("0.25"), 1, (0.25,)),
    ],
)
def test_c37_a_1d_array_tensor_list_or_tuple_of_n_objectives_is_accepted(ret, n, expected):
    assert objective_values(ret, n) == expected


@pytest.mark.parametrize(
    "ret, n, fragment",
    [
        ("0.5", 1, "'0.5' (str), not a number"), (True, 1, "True (bool), not a number"),
        (np.True_, 1, "True (bool), not a number"), (torch.tensor(False), 1, "False (bool), not a number"),
        ([0.5, "0.5"], 2, "'0.5' (str), not a number"), ([0.5, False], 2, "False (bool), not a number"),
        (np.array(["0.5"]), 1, "'0.5' (str), not a number"), (1 + 2j, 1, "(complex), not a number"),
        (np.zeros((1, 2)), 2, "array of shape (1, 2)"), (np.array([0.1, 0.2, 0.3]), 2, "returned 3 value(s)"),
    ],
)
def test_c37_a_value_that_is_not_a_number_fails_the_trial(ret, n, fragment):
    with pytest.raises(ValueError) as e:
        objective_values(ret, n)
    assert fragment in str(e.value), str(e.value)


def test_c37_refit_metrics_take_arrays_and_refuse_text():
    assert refit_metrics(np.array([0.25, 0.5])) == {"value_0": 0.25, "value_1": 0.5}
    assert refit_metrics({"acc": torch.tensor(0.25)}) == {"acc": 0.25}
    with pytest.raises(ValueError, match="not a number"):
        refit_metrics({"acc": "0.9"})


# --- C43: a sampler or pruner option written as a key ----------------------------------------------------


@pytest.mark.parametrize("group, option", [(g, o) for g, opts in (("sampler", SAMPLERS), ("pruner", PRUNERS))
                                           for o in opts])
def test_c43_a_group_option_written_as_a_key_is_refused_naming_the_group_override(group, option):
    with pytest.raises(SweeperConfigError) as e:
        Settings.from_node({"sampler": dict(_target_="optuna.samplers.TPESampler"),
                            "pruner": dict(_target_="optuna.pruners.NopPruner"), group: option}, world_size=1)
    text = str(e.value)
    assert f"hydra.sweeper.{group}={option} sets the key to a plain value" in text, text
    assert f"choose it with hydra/sweeper/{group}={option} (a slash, not a dot)" in text, text


@pytest.mark.parametrize("group, value, option", [("pruner", "null", "nop"), ("pruner", "SuccessiveHalving",
                                                  "successive_halving"), ("sampler", "optuna.samplers.RandomSampler",
                                                  "random"), ("sampler", "xyz", "<option>")])
def test_c43_the_nearest_option_is_named_for_other_values(group, value, option):
    node = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"},
            group: None if value == "null" else value}
    with pytest.raises(SweeperConfigError, match=f"choose it with hydra/sweeper/{group}={option} "):
        Settings.from_node(node, world_size=1)


# C43's command line: test_a_refused_command_line_stops_before_anything_runs


# --- C44: a typo in a config group or key name in the search space --------------------------------------


def _train_config_and_groups():
    """conf/train.yaml composed by Hydra, and ``group_options`` over Hydra's real config loader (as the
    sweeper builds it: options of a group, or with ``groups=True`` the groups below a path)."""
    yield from composed_with_group_options(REPO / "conf", "train")


@pytest.fixture
def train_config():
    yield from _train_config_and_groups()


@pytest.mark.parametrize(
    "line, meant",
    [
        ("deepspeeed=choice(zero2,zero3)", "'deepspeed'"),                 # the case: a config group
        ("training.learning_rat=interval(1e-5,1e-3)", "'training.learning_rate'"),  # a key below a group
        ("trainig.learning_rate=interval(1e-5,1e-3)", "'training.learning_rate'"),  # the group part of a key
        ("dat.stage=choice(search,final)", "'data.stage'"),
    ],
)
def test_c44_a_misspelt_group_or_key_names_the_one_meant_and_not_the_plus_form(train_config, line, meant):
    cfg, group_options = train_config
    key = line.split("=", 1)[0]
    with pytest.raises(SearchSpaceError) as e:
        check_param_keys(build_search_space({}, [line]), cfg, group_options)
    text = str(e.value)
    assert f"'{key}' is not a key or config group of the task's config (did you mean {meant}?)" in text, text
    assert f"+{key}" not in text, text


def test_c44_the_plus_form_is_advised_only_when_nothing_is_close(train_config):
    cfg, group_options = train_config
    with pytest.raises(SearchSpaceError, match=r"'warmup' is not a key of the task's config \(write '\+warmup=\.\.\.'"):
        check_param_keys(build_search_space({}, ["warmup=interval(0,1)"]), cfg, group_options)
    check_param_keys(build_search_space({}, ["deepspeed=choice(zero2,zero3)", "+warmup=interval(0,1)"]), cfg,
                     group_options)  # the right names pass


# C44's command lines: test_a_refused_command_line_stops_before_anything_runs


# --- A sampler whose optional package is missing (new-user trial: cmaes) ---------------------------------


@pytest.mark.parametrize("target, module", [("optuna.samplers.CmaEsSampler", "cmaes"),
                                            ("optuna.samplers.QMCSampler", "scipy"),
                                            ("optuna.samplers.GPSampler", "scipy")])
def test_a_sampler_whose_package_is_missing_is_refused_before_the_study_is_asked(monkeypatch, target, module):
    node = {"sampler": {"_target_": target}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}
    Settings.from_node(dict(node), world_size=1)  # installed here: accepted
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(SweeperConfigError, match=f"needs the Python package\\(s\\) {module}, .* pip install {module}"):
        Settings.from_node(dict(node), world_size=1)


def test_every_sampler_with_optional_packages_is_listed():
    """Each Optuna sampler that imports a package lazily is in SAMPLER_NEEDS (Optuna's source: a
    ``_LazyImport`` of a package outside optuna in the sampler's module)."""
    import inspect
    import re as _re

    import optuna
    from hydra_plugins.ds_optuna_sweeper._setting_keys import SAMPLER_NEEDS

    for name in ("CmaEsSampler", "QMCSampler", "GPSampler", "TPESampler", "RandomSampler", "NSGAIISampler"):
        cls = getattr(optuna.samplers, name)
        source = inspect.getsource(inspect.getmodule(cls))
        lazy = {m.split(".")[0] for m in _re.findall(r'_LazyImport\("([\w.]+)"\)', source)} - {"optuna"}
        assert lazy <= set(SAMPLER_NEEDS.get(f"optuna.samplers.{name}", ())), (name, lazy)
