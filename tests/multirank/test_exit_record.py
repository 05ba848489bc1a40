"""The per-rank exit records are observed, not predicted (``tests/apps/exit_record.py``).

A rank whose task succeeds but whose process then aborts in interpreter teardown (the DeepSpeed
``terminate called`` case ``exit_cleanly`` exists for) must be recorded with the status it really
died with, not the 0 its return value predicts; the process's own exit status agrees.

One process at world size 1 (``run_python``, issue 39 item 1): the recording parent watches its rank the same
way under torchrun; an abort cannot run inside pytest.
"""

import pytest
from optuna.trial import TrialState

from .sweep_helpers import exit_lines, exit_statuses, load, run_sweep

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(150)]


def test_a_rank_that_aborts_at_interpreter_exit_is_recorded_with_sigabrt_not_zero(tmp_path):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "fault.kind=abort_at_exit",
                    "fault.rank=0", "fault.trial=0", nproc=1, timeout_s=120)
    # The sweep itself succeeded: both trials complete.
    assert [t.state for t in load(tmp_path).trials] == [TrialState.COMPLETE] * 2
    assert exit_statuses(tmp_path) == {0: -6}, exit_lines(tmp_path)  # -6: killed by SIGABRT
    assert exit_lines(tmp_path)[0][0]["signal"] == "SIGABRT"
    assert res.returncode == -6, res.output[-3000:]  # the process itself died of the same signal
