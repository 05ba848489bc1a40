"""Plugin discovery: Hydra finds the sweeper after `pip install`, and scanning stays light and safe.

Hydra imports every module under ``hydra_plugins`` in every Hydra app and re-executes already
imported, non-``_`` modules in place (docs/hydra-internals.md, "Plugin discovery"), so a heavy or broken
import here would slow down or break unrelated apps, and a class defined in a scanned module would
change identity under an app that imported it before ``@hydra.main``.
"""

import json
import re
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper

import hydra_plugins.ds_optuna_sweeper as package

HEAVY = ["torch", "optuna", "transformers", "deepspeed", "accelerate", "sqlalchemy", "matplotlib"]
PUBLIC_CLASSES = ["RankTrial", "DSOptunaSweeperError", "SearchSpaceError", "SweeperConfigError", "RankTimeoutError",
                  "ConfigMismatchError", "TrialFailedError", "ControlPlaneError", "TrainingGroupBrokenError",
                  "ProcessGroupMisuseError", "StorageUnavailableError", "Preempted", "CallMismatchError", "Interrupted",
                  "GlueConfigError", "GlueUsageError", "MetricNotLoggedError", "MissingExtraError", "PeerLostError",
                  "SweepStoppedError", "TrialPreempted", "UpstreamChangedError",
                  "TrialScope", "LightningTrialScope"]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_sweeper_is_discovered():
    names = [c.__name__ for c in Plugins.instance().discover(Sweeper)]
    assert "DSOptunaSweeper" in names


def test_only_init_config_and_sweeper_are_visible_to_hydras_scanner():
    # The scanner skips modules whose own name starts with "_" (hydra/core/plugins.py), but
    # pkgutil.walk_packages imports every package on the way down: the role sub-packages' __init__
    # files must import nothing, and every module inside them must start with "_" too.
    path = Path(package.__file__).parent
    found = list(pkgutil.walk_packages(package.__path__, package.__name__ + "."))
    visible = sorted(m.name for m in found if not m.name.rsplit(".", 1)[-1].startswith("_"))
    assert visible == [f"{package.__name__}.config", f"{package.__name__}.sweeper"]
    roles = sorted(m.name.rsplit(".", 1)[-1] for m in found if m.ispkg)
    assert roles == ["_comm", "_glue", "_loop", "_study", "_task", "_tracking"], "the layout by role (docs/design.md)"
    for role in roles:
        code = [ln for ln in (path / role / "__init__.py").read_text().splitlines() if ln.strip()]
        assert len(code) == 1 and code[0].startswith('"""'), f"{role}/__init__.py: one docstring line, no imports"
    folders = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert folders == sorted(["_conf", *roles]), "_conf holds the packaged config groups; the rest are the roles"
    assert not [f for f in (path / "_conf").rglob("*") if f.is_file() and f.suffix != ".yaml"], "_conf: YAML only"


def test_public_api_is_the_package_root():
    assert sorted(package.__all__) == sorted(set(package.__all__))
    expected = {"current_trial", "in_trial", "RankTrial", "build_training_arguments", "trial_scope",
                "pruning_callback", "run_then_exit", "exit_cleanly", "lightning_pruning_callback",
                "lightning_trial_scope"}
    assert expected <= set(package.__all__)
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    classes = sorted(n for n in package.__all__ if isinstance(getattr(package, n), type))
    assert classes == sorted(PUBLIC_CLASSES), "the identity test below must cover every public class"


def _discover_in_a_fresh_interpreter(hide_this_plugin: bool) -> dict:
    """Run Hydra's discovery of sweepers in a new interpreter (``warnings`` as errors).

    Args:
        hide_this_plugin: if True, ``sys.modules['hydra_plugins.ds_optuna_sweeper'] = None`` first, so the
            scanner skips this package (the baseline: Hydra and the other installed plugins only).

    Returns:
        ``{"names": [sweeper class names], "heavy": [HEAVY modules imported], "cpu_s": CPU seconds of
        the discovery (``time.process_time``, every thread of that process), "stderr": str}``.

    Raises:
        AssertionError: the interpreter exited non-zero.
    """
    code = (
        "import json, sys, time, warnings\n"
        "warnings.simplefilter('error')\n"
        f"if {hide_this_plugin!r}:\n"
        "    sys.modules['hydra_plugins.ds_optuna_sweeper'] = None  # the scanner skips it\n"
        "t = time.process_time()\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "names = [c.__name__ for c in Plugins.instance().discover(Sweeper)]\n"
        "cpu_s = time.process_time() - t\n"
        f"if not {hide_this_plugin!r}:\n"
        "    import hydra_plugins.ds_optuna_sweeper as p\n"
        "    p.current_trial, p.RankTrial, p.SweeperConfigError\n"  # the light public names: still no heavy module
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'names': names, 'heavy': heavy, 'cpu_s': cpu_s}))\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr + proc.stdout}


def test_discovery_in_a_fresh_interpreter_imports_no_heavy_module_warns_nothing_and_is_fast():
    out = _discover_in_a_fresh_interpreter(hide_this_plugin=False)
    baseline = _discover_in_a_fresh_interpreter(hide_this_plugin=True)
    assert "[Hydra plugins scanner]" not in out["stderr"]
    assert "DSOptunaSweeper" in out["names"] and "DSOptunaSweeper" not in baseline["names"]
    assert out["heavy"] == []
    # CPU time, not wall time, so other processes on the machine do not count: this plugin adds about
    # 0.05 s to Hydra's own discovery here; importing torch at top level alone would add 0.8 s, torch and
    # optuna 1.3-1.6 s (docs/hydra-internals.md).
    assert out["cpu_s"] - baseline["cpu_s"] < 0.5, (out, baseline)


def test_every_public_class_keeps_its_identity_and_every_error_is_caught_after_hydras_scan():
    code = (
        "from hydra_plugins.ds_optuna_sweeper import *\n"
        "import hydra_plugins.ds_optuna_sweeper as p\n"
        f"before = {{n: getattr(p, n) for n in p.__all__}}\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "Plugins.instance().discover(Sweeper)\n"
        "from hydra_plugins.ds_optuna_sweeper import _errors\n"
        "from hydra_plugins.ds_optuna_sweeper._task import _handle as _trial\n"
        "from hydra_plugins.ds_optuna_sweeper._glue import _hf, _lightning\n"
        "# The scan may re-execute plugin modules in place: compare with what the modules hold now.\n"
        "after = {n: getattr(p, n) for n in p.__all__}\n"
        "changed = [n for n in before if before[n] is not after[n]]\n"
        "assert not changed, changed\n"
        "used = {'RankTrial': _trial.RankTrial, 'TrialScope': _hf.TrialScope,\n"
        "        'LightningTrialScope': _lightning.LightningTrialScope}\n"
        "used.update({n: getattr(_errors, n) for n in dir(_errors) if n[0].isupper()})\n"
        f"for name in {PUBLIC_CLASSES!r}:\n"
        "    assert before[name] is used[name], name\n"
        "caught = []\n"
        "for name, cls in sorted(used.items()):\n"
        "    if not (isinstance(cls, type) and issubclass(cls, BaseException)):\n"
        "        continue\n"
        "    try:\n"
        "        raise cls(143) if name == 'Preempted' else cls('x')\n"
        "    except before[name]:\n"
        "        caught.append(name)\n"
        "    except BaseException as e:\n"
        "        print('missed', name, type(e)); raise\n"
        "print(','.join(caught))\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    caught = proc.stdout.strip().splitlines()[-1].split(",")
    assert sorted(caught) == sorted(n for n in PUBLIC_CLASSES if n not in ("RankTrial", "TrialScope", "LightningTrialScope"))


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


@pytest.mark.parametrize(("package_name", "name", "extra"), [
    ("transformers", "build_training_arguments", "hf"),
    ("transformers", "pruning_callback", "hf"),
    ("lightning", "lightning_pruning_callback", "lightning"),
    ("lightning", "lightning_trial_scope", "lightning"),
])
def test_training_glue_without_its_extra_names_the_extra(package_name, name, extra):
    # The core install has neither transformers nor lightning: the glue's names say which extra brings them,
    # and the core API (including the script ending run_then_exit) works without them.
    code = (
        "import sys\n"
        f"sys.modules[{package_name!r}] = None  # as if not installed\n"
        "import hydra_plugins.ds_optuna_sweeper as p\n"
        "assert p.current_trial and p.RankTrial and p.run_then_exit and p.exit_cleanly\n"
        "try:\n"
        f"    p.{name}\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert f"pip install 'hydra-ds-optuna-sweeper[{extra}]'" in proc.stdout, proc.stdout
    assert f"needs {package_name}" in proc.stdout


def test_readme_code_layout_lists_every_module():
    """The "Code layout" page (docs/contributing/layout.md, the README's table before issue 43) names each module
    of the package, by its path below the package."""
    path = Path(package.__file__).parent
    layout = (path.parents[1] / "docs" / "contributing" / "layout.md").read_text()
    table = layout[layout.index("# Code layout"):].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", table, flags=re.M))
    modules = {p.relative_to(path).as_posix() for p in path.rglob("*.py")
               if "__pycache__" not in p.parts and not (p.name == "__init__.py" and p.parent != path)}
    assert listed == modules, f"missing: {sorted(modules - listed)}; gone: {sorted(listed - modules)}"
