"""Plugin discovery: Hydra finds the sweeper after `pip install`, and scanning stays light.

Hydra imports every module under ``hydra_plugins`` in every Hydra app (NOTES-hydra.md), so a heavy
or broken import here would slow down or break unrelated apps.
"""

import json
import subprocess
import sys

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper

HEAVY = ["torch", "optuna", "transformers", "deepspeed", "accelerate"]


def test_sweeper_is_discovered():
    names = [c.__name__ for c in Plugins.instance().discover(Sweeper)]
    assert "DSOptunaSweeper" in names


def test_discovery_in_a_fresh_interpreter_imports_no_heavy_module_and_warns_nothing():
    code = (
        "import json, sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "names = [c.__name__ for c in Plugins.instance().discover(Sweeper)]\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'names': names, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "[Hydra plugins scanner]" not in proc.stderr + proc.stdout
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "DSOptunaSweeper" in out["names"]
    assert out["heavy"] == []


def test_config_groups_are_registered():
    from hydra.core.config_store import ConfigStore

    import hydra_plugins.ds_optuna_sweeper.config  # noqa: F401

    repo = ConfigStore.instance().repo
    sweeper = repo["hydra"]["sweeper"]
    assert "ds_optuna.yaml" in sweeper
    assert {f"{n}.yaml" for n in ["tpe", "random", "cmaes", "nsgaii", "nsgaiii", "qmc", "gp", "grid", "bruteforce"]} <= set(sweeper["sampler"])
    assert {
        f"{n}.yaml"
        for n in ["nop", "median", "percentile", "successive_halving", "hyperband", "threshold", "patient", "wilcoxon"]
    } <= set(sweeper["pruner"])


def test_classes_keep_their_identity_when_hydra_rescans_imported_modules():
    # Hydra re-executes already-imported plugin modules in place; an app that imported our errors or
    # trial handle before @hydra.main must still catch and match the objects the sweeper uses.
    code = (
        "from hydra_plugins.ds_optuna_sweeper.errors import SearchSpaceError\n"
        "from hydra_plugins.ds_optuna_sweeper.trial import RankTrial, current_trial\n"
        "from hydra_plugins.ds_optuna_sweeper.search_space import build_search_space\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "Plugins.instance().discover(Sweeper)\n"
        "import hydra_plugins.ds_optuna_sweeper._impl as impl\n"
        "import hydra_plugins.ds_optuna_sweeper.trial as trial\n"
        "assert trial.RankTrial is RankTrial and impl.RankTrial is RankTrial\n"
        "try:\n"
        "    build_search_space({}, ['x=interval(2,1)'])\n"
        "except SearchSpaceError:\n"
        "    print('caught')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "caught"
