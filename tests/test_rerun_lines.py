"""What a sweep leaves to rerun: the results file's ``rerun_command``, pasted into a shell exactly as
written, runs the same config in the same world and returns ``best_value`` exactly (case C19).

Rank 0 alone writes the line: in process at world size 1 (``tests/in_process.py``), the pasted line split as
bash splits it and run in process too (``tests/rerun_in_process.py``). The line of a 2-rank trial with
task-suggested params, pasted into bash and run by torchrun: ``tests/multirank/test_refit.py`` (C19, C49).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.rerun_in_process import paste_in_process, run_rerun_app

pytestmark = [pytest.mark.timeout(120)]


def _sweep(tmp_path: Path, *args: str, flags: tuple[str, ...] = ()):
    """``python tests/apps/rerun_app.py [flags] -m hydra.sweep.dir=<tmp>/sweep *args`` in process."""
    argv = [*flags, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args]
    return run_rerun_app(argv, cwd=tmp_path, env={"DSO_RECORD_DIR": str(tmp_path / "rec")}).check()


def _results(tmp_path: Path) -> dict:
    text = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    results = yaml.safe_load(text)
    lines = text.splitlines()
    for i, ln in enumerate(lines):  # one line in the file too: a YAML fold would lose the tail on copy
        if ln.lstrip(" -").startswith("rerun_command: ") and i + 1 < len(lines):
            nxt = lines[i + 1]
            assert not nxt.startswith(" " * (len(ln) - len(ln.lstrip(" -")) + 1)), f"folded:\n{ln}\n{nxt}"
    return results


def test_c19_rerun_line_keeps_the_config_name_and_group_overrides_at_world_size_1(tmp_path):
    _sweep(tmp_path, "x=interval(0,1)", "opt=choice(sgd,adam)", "+extra=2", flags=("--config-name", "other"))
    results = _results(tmp_path)
    line = results["rerun_command"]
    # The sweep ran each trial in a one-process group with torchrun's variables set: the rerun line
    # recreates that world (a task's guarded init_process_group() needs them), found by a new-user trial.
    assert "--config-name other" in line and " --standalone --nproc_per_node 1 " in line, line
    assert paste_in_process(tmp_path, line) == results["best_value"]


def test_multi_objective_results_carry_solutions_and_a_rerun_line_per_pareto_trial(tmp_path):
    _sweep(tmp_path, "x=interval(0,1)", "n_objectives=2", "hydra.sweeper.direction=[minimize,minimize]",
           "hydra.sweeper.n_trials=4")
    results = _results(tmp_path)
    assert [s["params"] for s in results["solutions"]] == [e["params"] for e in results["pareto_front"]]
    assert all(len(s["values"]) == 2 for s in results["solutions"])
    entry = results["pareto_front"][0]
    assert paste_in_process(tmp_path, entry["rerun_command"]) == entry["values"][0]


def test_c19_a_trial_from_an_earlier_run_keeps_its_own_fixed_overrides(tmp_path):
    # Resume with other fixed overrides: the best trial (from the first run) must rerun with the first
    # run's overrides, not the current run's (found by a new-user trial of this README).
    _sweep(tmp_path, "x=choice(0.3,0.31)", "+extra=0", "hydra.sweeper.n_trials=2")
    _sweep(tmp_path, "x=choice(0.3,0.31)", "+extra=5", "hydra.sweeper.n_trials=3")
    results = _results(tmp_path)
    assert results["best_trial"] in (0, 1)
    line = results["rerun_command"]
    assert "+extra=0" in line and "+extra=5" not in line, line
    assert paste_in_process(tmp_path, line) == results["best_value"]
