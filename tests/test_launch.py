"""The per-round Launch value (issue 22, item 1): frozen, read-only, and the runner never reaches the driver."""

import ast
import dataclasses
from pathlib import Path

import pytest

from hydra_plugins.ds_optuna_sweeper._loop._messages import Launch, LaunchMode
from hydra_plugins.ds_optuna_sweeper._loop._messages import TrialPayload

PKG = Path(__file__).resolve().parents[1] / "hydra_plugins" / "ds_optuna_sweeper" / "_loop"


def test_launch_is_frozen_and_its_trials_read_only():
    launch = Launch.of([TrialPayload(3), TrialPayload(4)], optuna_trials={3: "t3", 4: "t4"})
    assert launch.payloads == (TrialPayload(3), TrialPayload(4))
    assert launch.mode is LaunchMode.TRIAL and not launch.refit
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.mode = LaunchMode.REFIT  # type: ignore[misc]
    with pytest.raises(TypeError):
        launch.optuna_trials[5] = "t5"  # type: ignore[index]
    assert launch.payload(4) == TrialPayload(4)
    with pytest.raises(KeyError, match="no trial 7"):
        launch.payload(7)


def test_other_ranks_launch_has_no_trials_and_a_noop_heartbeat():
    launch = Launch.of([TrialPayload(0)])
    assert dict(launch.optuna_trials) == {}
    with launch.heartbeat:
        pass


def test_refit_launch_carries_no_study_object():
    assert Launch.of([TrialPayload(1)], LaunchMode.REFIT).refit
    with pytest.raises(ValueError, match="refit"):
        Launch.of([TrialPayload(1)], LaunchMode.REFIT, optuna_trials={1: object()})
    with pytest.raises(ValueError, match="at least one"):
        Launch.of([])


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.update(f"{node.module}" if node.module else a.name for a in node.names)
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_runner_never_imports_or_calls_the_driver():
    """The design's "never Runner -> Driver": every-rank code cannot reach rank-0 code."""
    source = (PKG / "_runner.py").read_text()
    assert "_driver" not in _imported_modules(PKG / "_runner.py")
    assert "Driver" not in source and "driver." not in source


EVERY_RANK = ["_loop/_runner.py", "_loop/_config_check.py", "_loop/_agree.py", "_loop/_joblog.py",
              "_loop/_group.py", "_loop/_messages.py", "_loop/_trial_groups.py"]
#: what every-rank code may take from the study side: pure text and name tables, no study access.
PURE_STUDY_SIDE = {"_override_text", "_stored"}


@pytest.mark.parametrize("module", EVERY_RANK + ["_comm/*", "_task/*", "_glue/*", "_tracking/_task_env.py"])
def test_every_rank_code_never_imports_rank0_code(module):
    """The design's "nevers" (docs/design.md): code every rank runs imports neither the driver, the refit
    runs, nor the study side beyond its pure text and name tables."""
    package = PKG.parent
    paths = sorted(p for p in package.glob(module) if p.suffix == ".py")  # not __pycache__
    assert paths, f"{module} names no module of the package (moved or merged? update the list)"
    for path in paths:
        for name in _imported_modules(path):
            last = name.rsplit(".", 1)[-1]
            assert last not in {"_driver", "_refit", "_sweep"}, f"{path.name} imports {name}"
            if "_study" in name.split("."):
                assert last in PURE_STUDY_SIDE, f"{path.name} imports {name}"
