"""Optuna's ``constraints_func`` in config form, for the samplers that take it (issue 38, C58).

The README did not say how to give a sampler a callable argument in a config, and a sampler option file of the
app's own (``conf/hydra/sweeper/sampler/tpe_constrained.yaml``: ``defaults: [tpe]`` plus ``constraints_func``)
was refused by Hydra ("Key 'constraints_func' not in 'TPESamplerConf'"). The schemas of TPE, NSGA-II, NSGA-III
and GP now have the field; the callable is ``{_target_: hydra.utils.get_method, path: module.function}``.
Optuna calls it on rank 0 when each trial is told and stores the values as the trial's ``constraints``.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): the sampler lives on rank 0 alone.
"""

import pytest

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load

FUNC = "{_target_:hydra.utils.get_method,path:search_space_fns.x_below_half}"


def _check(tmp_path, n_trials: int) -> None:
    trials = load(tmp_path).trials
    assert len(trials) == n_trials
    for t in trials:  # search_space_fns.x_below_half: [x - 0.5]
        assert t.system_attrs["constraints"] == pytest.approx([t.params["x"] - 0.5]), t


def test_an_app_sampler_option_file_with_constraints_func(tmp_path):
    sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.n_trials=3", "hydra/sweeper/sampler=tpe_constrained").check()
    _check(tmp_path, 3)


@pytest.mark.parametrize("sampler", ["nsgaii", "tpe"])
def test_constraints_func_on_the_command_line(tmp_path, sampler):
    sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.n_trials=3", f"hydra/sweeper/sampler={sampler}",
              f"hydra.sweeper.sampler.constraints_func={FUNC}").check()
    _check(tmp_path, 3)
