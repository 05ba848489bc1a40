"""Optuna's "sampled independently" fallback warning is said once, not every trial (issue 38, C59).

A new user's ``hydra/sweeper/sampler=cmaes`` with a ``choice`` param got Optuna's warning in every trial from
trial 1 on. Now the sweeper says it once before trial 0 (CmaEsSampler never models a categorical param), and a
fallback it cannot predict (a categorical suggested inside the task) passes once per param.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): the sampler and the notice are rank 0's.
"""

import re

import pytest

from hydra_plugins.ds_optuna_sweeper._study._study import predicted_fallbacks
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from tests.in_process import sweep

OPTUNA_WARNING = "is sampled independently using"
NOTICE = "CmaEsSampler does not model categorical params: 'c' will be sampled independently"


def test_cmaes_with_a_choice_param_says_it_once_before_trial_0(tmp_path):
    res = sweep(tmp_path, "x=interval(-1,1)", "+c=choice(a,b)", "hydra/sweeper/sampler=cmaes",
                    "hydra.sweeper.n_trials=5")
    res.check()
    assert res.output.count(NOTICE) == 1, res.output[-4000:]
    assert res.output.index(NOTICE) < res.output.index("Launching")
    assert OPTUNA_WARNING not in res.output, res.output[-4000:]


def test_a_fallback_nobody_predicted_passes_once_per_param_in_each_sweep(tmp_path):
    for run in ("a", "b"):  # the second sweep in one process says it again (the count starts with each study)
        res = sweep(tmp_path / run, "x=interval(-1,1)", "suggest=true", "hydra/sweeper/sampler=cmaes",
                    "hydra.sweeper.n_trials=5")
        res.check()
        warnings = [ln for ln in res.output.splitlines() if OPTUNA_WARNING in ln]
        # Optuna's own, once, from trial 1 (was 4 times)
        assert len(warnings) == 1 and "`s_cat`" in warnings[0], (run, warnings)
        assert re.search(r"Trial#(\d+)", warnings[0]).group(1) == "1", warnings


@pytest.mark.parametrize("node,expected", [
    ({"_target_": "optuna.samplers.CmaEsSampler"}, ["c"]),
    ({"_target_": "optuna.samplers.CmaEsSampler", "warn_independent_sampling": True}, []),  # the user's choice
    ({"_target_": "optuna.samplers.TPESampler"}, []),
])
def test_which_params_are_announced(node, expected):
    space = build_search_space({}, ["x=interval(-1,1)", "c=choice(a,b)", "n=range(1,4)"])
    assert predicted_fallbacks(node, space.params) == expected
