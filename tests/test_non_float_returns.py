"""A sweep ended by the package's own verdict says so once, cleanly (issue 38, C59).

A new user's task returned ``trainer.evaluate()``'s metrics dict: the message was right ("not a number") but
printed once per rank, each under a Python traceback into the package, then under torchrun's
``ChildFailedError`` report ending "To enable traceback see ...", with no word of what to return. Now rank 0
says it once as one paragraph (also in torchrun's "Root Cause", through torchrun's error file), the message
says to return a float, and every rank exits 1.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): the verdict and its message are rank 0's,
and the error file torchrun reads its "Root Cause" from is written here too (``TORCHELASTIC_ERROR_FILE`` set as
torchrun sets it). Under real torchrun: every rank exiting 1 on a failure-rate stop is
``tests/faults/test_faults.py::test_a_failure_on_one_rank_*``;
a message of the same path (``_refusal.announce``) said twice (rank 0's line, torchrun's report) and without any
traceback outside torchrun's own is ``tests/multirank/test_setup_refusal.py``'s set-up refusal.
"""

import json
import re

import pytest

from tests.in_process import sweep

STOPPED = "ds_optuna stopped the sweep: TrialFailedError: 1 of 1 trials of this run failed"


@pytest.mark.parametrize("kind", ["dict", "text"])
def test_a_task_returning_no_float_stops_the_sweep_with_one_message_and_a_hint(tmp_path, kind):
    error_file = tmp_path / "error.json"
    res = sweep(tmp_path, "x=interval(-1,1)", f"fault.kind={kind}", "fault.rank=all",
                env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert res.returncode == 1
    assert "return a float (or a sequence of floats, one per hydra.sweeper.direction, for multi-objective)" in res.output
    if kind == "dict":
        assert "such as metrics['eval_loss'] or metrics['epoch']" in res.output, res.output[-4000:]
    assert res.output.count(STOPPED) == 1, res.output[-4000:]
    assert "Traceback (most recent call last)" not in res.output, res.output[-4000:]
    assert not re.search(r'File "[^"]*hydra_plugins', res.output), res.output[-4000:]
    # torchrun's Root Cause: the message itself as its "traceback", no Python one.
    root = json.loads(error_file.read_text())["message"]
    assert STOPPED in root["message"] and root["extraInfo"]["py_callstack"] == root["message"], root
