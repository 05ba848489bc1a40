"""``bench/trial_path.py``, issue 40's path of one trial: its layers on known modules, and the measure itself on a
real 2-trial in-process sweep (trial 1's round), so that a change of the loop that the measure no longer follows
(the round never found, nothing recorded, the loop's tell not among the crossings) fails here."""

import importlib.util
import sys

from tests import in_process
from tests.torchrun_utils import REPO

_spec = importlib.util.spec_from_file_location("trial_path", REPO / "bench" / "trial_path.py")
trial_path = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("trial_path", trial_path)  # its dataclass looks its module up there
_spec.loader.exec_module(trial_path)
P = trial_path.PACKAGE


def test_layers_follow_design_md_from_the_root_up_to_the_loop_and_the_doors():
    layer = {m: trial_path.LAYERS[trial_path.folder(f"{P}.{m}")] for m in
             ("_errors", "_upstream", "_comm._ranks", "_task._slot", "_study._tell", "_loop._sweep", "sweeper")}
    assert layer["_errors"] == layer["_upstream"] < layer["_comm._ranks"] < layer["_task._slot"] \
        < layer["_study._tell"] < layer["_loop._sweep"] < layer["sweeper"]
    assert trial_path.folder(P) == "doors"  # the package's __init__: the public API
    assert trial_path.control_plane(f"{P}._settings") and trial_path.control_plane(f"{P}._loop._driver")
    assert not trial_path.control_plane(f"{P}._glue._hf") and not trial_path.control_plane(f"{P}._tracking._record")
    assert not trial_path.control_plane("optuna.study.study")


def test_one_round_of_a_real_sweep_is_measured(tmp_path):
    figures = trial_path.measure(
        lambda: in_process.sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)").check(), trial=1)
    assert figures["asked"] == [1]
    for part in ("round", "iteration"):
        counts = figures[part]
        for key in ("stops", "climbs", "returns", "modules_visited", "package_calls"):
            assert isinstance(counts[key], int) and counts[key] >= 0, (part, key, counts[key])
        assert counts["stops"] > 0 and counts["modules_visited"] > 1 and counts["package_calls"] >= counts["stops"]
    assert figures["iteration"]["stops"] >= figures["round"]["stops"]
    stops = [(c["caller"], c["callee"], c["callee_func"]) for c in figures["crossings"] if c["stop"] and c["in_round"]]
    # the round runs from the loop's ask to the study's tell: both ends are among its crossings
    assert any(callee.startswith("_study._tell") and func == "tell" for _, callee, func in stops), stops
    assert any(caller == "_loop._sweep" and func.endswith("next_command") for caller, _, func in stops), stops
    # the task wrapper Hydra's launcher calls back is followed (the job's config check runs inside it)
    assert any(callee == "_loop._config_check" for _, callee, _ in stops), stops
