"""Bad sweeper settings fail at start with a message that says what to do (C15, C16)."""

import re

import pytest

from hydra_plugins.ds_optuna_sweeper._setting_keys import merge_onto_schema as validate_sweeper_config
from hydra_plugins.ds_optuna_sweeper import SweeperConfigError
from tests.in_process import run_app
from tests.torchrun_utils import REPO


#: The top-level keys of the configuration reference (docs/reference/config.md, generated from the config
#: dataclasses), written out here (not read from the code that builds the message), in the page's order;
#: ``refit`` stands for its ``refit.*`` rows.
README_SWEEPER_KEYS = [
    "sampler", "pruner", "scheduler", "direction", "storage", "study_name", "n_trials", "n_jobs", "stop", "timeout",
    "max_failure_rate", "params", "custom_search_space", "enqueue_trials", "plots", "plot_every", "repeats",
    "seed_key", "seeds", "rank_timeout", "retry_failed_trials", "heartbeat_interval", "grace_period",
    "storage_retry_timeout", "allow_search_space_change", "backend", "refit", "checkpoints", "tracking",
]


def _readme_config_table_keys() -> list[str]:
    """Top-level keys named in the first column of the configuration reference's table, in order."""
    text = (REPO / "docs" / "reference" / "config.md").read_text()
    table = text.split("| key | type | default | description |", 1)[1].split("\n\n", 1)[0]
    table = "| key |\n" + table.lstrip("\n")
    keys: list[str] = []
    for row in table.splitlines()[2:]:
        for key in re.findall(r"`([a-z_.]+)`", row.split("|")[1]):
            if key.split(".")[0] not in keys:
                keys.append(key.split(".")[0])
    return keys


def test_c16_the_explicit_key_list_is_the_readme_config_table():
    assert _readme_config_table_keys() == README_SWEEPER_KEYS


def test_c16_unknown_key_names_it_and_the_valid_ones():
    with pytest.raises(SweeperConfigError) as e:
        validate_sweeper_config({"_target_": "x", "max_failure_rat": 0.5})
    text = str(e.value)
    assert "'max_failure_rat' (did you mean 'max_failure_rate'?)" in text
    listed = text.split("Valid keys: ", 1)[1].split(". ", 1)[0].split(", ")
    assert sorted(listed) == sorted(README_SWEEPER_KEYS)


def test_c16_key_of_another_sweeper_schema():
    with pytest.raises(SweeperConfigError, match="'optim'"):
        validate_sweeper_config({"optim": {"budget": 10}})


def test_wrong_type_is_reported_with_the_key():
    with pytest.raises(SweeperConfigError, match="n_trials"):
        validate_sweeper_config({"n_trials": "many"})


def test_valid_settings_get_defaults():
    cfg = validate_sweeper_config({"n_trials": 4, "direction": ["minimize", "maximize"]})
    assert cfg.n_trials == 4 and cfg.rank_timeout == 600.0 and cfg.n_jobs == 1


#: The refusal of a misspelt ``hydra.sweeper`` key, as the rank that says it logs it.
TYPO_REFUSED = ("hydra.sweeper refused: SweeperConfigError: Unknown hydra.sweeper key(s) for hydra/sweeper=ds_optuna: "
                "'{key}' (did you mean '{meant}'?)")


@pytest.mark.parametrize("key, meant, env, said_by", [
    ("max_failure_rat", "max_failure_rate", {}, "rank 0/1"),
    ("n_trail", "n_trials", {}, "rank 0/1"),
    # rank 1 of a torchrun world of 2: the same refusal, said by rank 0 only (issue 38, C59); rank 1 is quiet
    ("n_trail", "n_trials", {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, None),
])
def test_c16_typo_on_the_command_line_stops_before_any_trial(tmp_path, key, meant, env, said_by):
    """Refused while Hydra builds the sweeper, before any process group exists: exit 1, the key and the one meant
    named once by rank 0 (a world of 2 is refused alike on each rank, ``sweeper.py``: the every-rank exit is the
    refusal contract launch, ``tests/multirank/test_setup_refusal.py``), no traceback, no Hydra "Error in call to
    target" repr, no trial and no study."""
    res = run_app("sweep_app", ["-m", f"hydra.sweep.dir={tmp_path}/s", f"hydra.sweeper.{key}=0.5"],
                  config_name="app", env={"DSO_RECORD_DIR": str(tmp_path / "rec"), **env})
    assert res.returncode == 1, res.output[-3000:]
    refused = TYPO_REFUSED.format(key=key, meant=meant)
    if said_by:
        assert res.output.count(f"{said_by}: {refused}") == 1, res.output[-3000:]
    else:
        assert "hydra.sweeper refused" not in res.output, res.output[-3000:]
    assert "Error in call to target" not in res.output and "Traceback" not in res.output, res.output[-3000:]
    assert not (tmp_path / "rec").exists() and not (tmp_path / "s" / "optuna.db").exists()


def test_c15_sweeper_keys_at_top_level_warn_and_log_effective_values(tmp_path):
    res = run_app("sweep_app", ["-m", "--config-name", "misplaced", f"hydra.sweep.dir={tmp_path}/s",
                                "hydra.sweeper.n_trials=1", "hydra.sweeper.plots=false"], config_name="app",
                  env={"DSO_RECORD_DIR": str(tmp_path / "rec")}).check()
    assert "Key(s) ['direction', 'n_trials'] at the top level of the task config" in res.output
    assert "effective direction ['minimize']" in res.output
    assert "Study 'sweep_app'" in res.output


@pytest.mark.parametrize("node,message", [
    ({"stop": {"goall": 1}}, "Unknown hydra.sweeper key 'hydra.sweeper.stop.goall' (did you mean 'goal'?). "
                             "Valid keys of hydra.sweeper.stop: goal, patience, terminator."),
    ({"checkpoints": {"keep_bset": 2}}, "'hydra.sweeper.checkpoints.keep_bset' (did you mean 'keep_best'?)"),
    ({"tracking": {"mlflow": {"trackin_uri": "x"}}}, "(did you mean 'tracking_uri'?). Valid keys of "
                                                     "hydra.sweeper.tracking.mlflow: tracking_uri,"),
    ({"stop": {"goal": "abc"}}, "Invalid hydra.sweeper setting hydra.sweeper.stop.goal: Value 'abc' of type 'str' "
                                "could not be converted to Float."),
])
def test_a_bad_key_inside_a_node_is_named_in_full_with_the_likely_fix(node, message):
    """Unknown keys one level down (a new user's ``hydra.sweeper.stop.goall=1``) get the top-level check's
    wording: the full key, the nearest valid key and the node's valid keys, not OmegaConf's raw text."""
    with pytest.raises(SweeperConfigError) as e:
        validate_sweeper_config({"_target_": "x", **node})
    assert message in str(e.value), str(e.value)


_BASE = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}


@pytest.mark.parametrize("baselines, message", [
    ({"7": {"x": 0.1}}, "not only digits"),
    ({"a b": {}}, "use letters, digits"),
    ({"..": {}}, "starting with a letter, digit or '_'"),  # refit/.. is the sweep dir (new-user trial)
    ({".": {}}, "starting with a letter, digit or '_'"),
    ({"other": None}, "to drop it: ~hydra.sweeper.refit.baselines.other"),
    ({"ok": {"x": 0.1, "not a key": 1}}, "must be a mapping of config keys to values"),
])
def test_refit_baselines_with_a_bad_name_or_key_are_refused(baselines, message):
    from hydra_plugins.ds_optuna_sweeper._settings import Settings

    with pytest.raises(SweeperConfigError, match=message):
        Settings.from_node({**_BASE, "refit": {"enabled": True, "baselines": baselines}}, world_size=1)


def test_refit_baselines_become_override_lines_in_order():
    from hydra_plugins.ds_optuna_sweeper._settings import Settings

    settings = Settings.from_node({**_BASE, "refit": {"enabled": True, "trials": [], "baselines": {
        "hand": {"training.learning_rate": 3e-4, "+model.tag": "a b"}, "composed": {}}}}, world_size=1)
    assert settings.refit_baselines == (
        ("hand", ("training.learning_rate=0.0003", "+model.tag=a b")), ("composed", ()))
