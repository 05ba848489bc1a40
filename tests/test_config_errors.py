"""Bad sweeper settings fail at start with a message that says what to do (C15, C16)."""

import pytest

from hydra_plugins.ds_optuna_sweeper._settings import merge_onto_schema as validate_sweeper_config, valid_sweeper_keys
from hydra_plugins.ds_optuna_sweeper import SweeperConfigError
from tests.torchrun_utils import run_python

APP = "tests/apps/sweep_app.py"


def test_c16_unknown_key_names_it_and_the_valid_ones():
    with pytest.raises(SweeperConfigError) as e:
        validate_sweeper_config({"_target_": "x", "max_failure_rat": 0.5})
    text = str(e.value)
    assert "'max_failure_rat' (did you mean 'max_failure_rate'?)" in text
    for key in valid_sweeper_keys():
        assert key in text


def test_c16_key_of_another_sweeper_schema():
    with pytest.raises(SweeperConfigError, match="'optim'"):
        validate_sweeper_config({"optim": {"budget": 10}})


def test_wrong_type_is_reported_with_the_key():
    with pytest.raises(SweeperConfigError, match="n_trials"):
        validate_sweeper_config({"n_trials": "many"})


def test_valid_settings_get_defaults():
    cfg = validate_sweeper_config({"n_trials": 4, "direction": ["minimize", "maximize"]})
    assert cfg.n_trials == 4 and cfg.rank_timeout == 600.0 and cfg.n_jobs == 1


def test_c16_typo_on_the_command_line_stops_before_any_trial(tmp_path):
    res = run_python(APP, ["-m", f"hydra.sweep.dir={tmp_path}/s", "hydra.sweeper.max_failure_rat=0.5"],
                     extra_env={"DSO_RECORD_DIR": str(tmp_path / "rec")}, timeout_s=60)
    assert res.returncode != 0
    assert "did you mean 'max_failure_rate'?" in res.output
    assert not (tmp_path / "rec").exists() and not (tmp_path / "s" / "optuna.db").exists()


def test_c15_sweeper_keys_at_top_level_warn_and_log_effective_values(tmp_path):
    res = run_python(APP, ["-m", "--config-name", "misplaced", f"hydra.sweep.dir={tmp_path}/s",
                           "hydra.sweeper.n_trials=1"], timeout_s=60,
                     extra_env={"DSO_RECORD_DIR": str(tmp_path / "rec")}).check()
    assert "Key(s) ['direction', 'n_trials'] at the top level of the task config" in res.output
    assert "effective direction ['minimize']" in res.output
    assert "Study 'sweep_app'" in res.output
