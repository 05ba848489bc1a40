"""Cases C51 and C52: command-line hydra overrides keep Hydra's meaning, and printed commands paste.

C51 (hydra#2247, #3427): interpolations in command-line ``hydra.*`` overrides are resolved per job, when
Hydra resolves them, not at the sweep's set-up (which refused ``${hydra.job.num}`` as a missing value and
``${hydra:runtime.cwd}`` with "HydraConfig was not set").
C52: rerun, refit and resume lines run as written for a sweep dir with unicode, spaces and quotes (they
were shell-quoted but not Hydra-quoted: Hydra's lexer refused the pasted line).

Rank 0 alone resolves the sweep's set-up and writes the lines: in process at world size 1
(``tests/in_process.py``); a pasted line is split as bash splits it and its arguments go through Hydra's own
parser in process (``tests/rerun_in_process.py``). That every rank of a job runs in the one job dir Hydra
resolved: ``tests/multirank/test_refit.py`` (refit dirs and a pasted 2-rank rerun line).
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.in_process import run_app
from tests.multirank.sweep_helpers import records
from tests.rerun_in_process import paste_in_process, run_pasted_line, run_rerun_app
from tests.torchrun_utils import REPO

pytestmark = [pytest.mark.timeout(120)]

#: a directory name a file system allows and both parsers care about (case C52's, plus quotes and ``$``)
AWKWARD = "H4 dir/ünïcødé 東京 b'q\"$x"


def test_c51_interpolations_in_command_line_hydra_overrides_resolve_per_job(tmp_path):
    args = ["-m", "hydra.sweep.dir=${hydra:runtime.cwd}/out_${now:%Y}", "hydra.job.chdir=true",
            "hydra.sweep.subdir=${hydra.job.num}_${label}_${oc.env:DSO_C51}_${hydra.job.override_dirname}",
            "hydra.sweeper.n_trials=2", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30", "x=choice(1,2)"]
    run_app("sweep_app", args, config_name="app", cwd=tmp_path,
            env={"DSO_RECORD_DIR": str(tmp_path / "records"), "DSO_C51": "env"}).check()
    [sweep] = tmp_path.glob("out_*")  # ${hydra:runtime.cwd} is the launch's working directory
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for t in study.trials:
        job_dir = sweep / f"{t.number}_plain_env_x={t.params['x']}"
        assert (job_dir / ".hydra" / "overrides.yaml").is_file(), sorted(p.name for p in sweep.iterdir())
        assert Path(records(tmp_path)[t.number, 0]["output_dir"]) == job_dir


def test_c52_rerun_and_refit_lines_paste_with_an_awkward_sweep_dir(tmp_path):
    sweep = tmp_path / AWKWARD
    quoted = "'" + str(sweep).replace("\\", "\\\\").replace("'", "\\'") + "'"  # Hydra's quoted string
    run_rerun_app(["-m", f"hydra.sweep.dir={quoted}", "x=interval(0,1)", "hydra.sweeper.n_trials=2",
                   "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.overrides=['stage=final']"],
                  cwd=tmp_path, env={"DSO_RECORD_DIR": str(tmp_path / "rec")}).check()
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert paste_in_process(tmp_path, results["rerun_command"]) == results["best_value"]
    (refit,) = results["refit"]
    assert paste_in_process(tmp_path, refit["rerun_command"], stage="final") == refit["metrics"]["test_value"]
    assert (sweep / "rerun" / "refit-{}".format(refit["trial"])).is_dir()  # the run dir, unchanged


def test_c52_the_printed_resume_line_pastes_with_an_awkward_sweep_dir(tmp_path):
    sweep = tmp_path / AWKWARD
    quoted = "'" + str(sweep).replace("\\", "\\\\").replace("'", "\\'") + "'"
    res = run_app("sweep_app", [
        "-m", f"hydra.sweep.dir={quoted}", "x=interval(0,1)", "hydra.sweeper.n_trials=2", "hydra.sweeper.plots=false",
        "hydra.sweeper.max_failure_rate=0", "fail_on_rank=0", "fail_on_trial=0"], config_name="app",
        env={"DSO_RECORD_DIR": str(tmp_path / "records")})
    assert res.returncode != 0
    found = re.search(r"resume with: (.+)$", res.output, re.M)
    assert found, res.output[-3000:]
    run_pasted_line(found.group(1), cwd=REPO, env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
