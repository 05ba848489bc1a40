"""A sweep ended by the package's own verdict says so once, cleanly (issue 38, C59).

A new user's task returned ``trainer.evaluate()``'s metrics dict: the message was right ("not a number") but
printed once per rank, each under a Python traceback into the package, then under torchrun's
``ChildFailedError`` report ending "To enable traceback see ...", with no word of what to return. Now rank 0
says it once as one paragraph (also in torchrun's "Root Cause", through torchrun's error file), the message
says to return a float, and every rank exits 1.
"""

import re

import pytest

from tests.multirank.sweep_helpers import LINGER, exit_lines, exit_statuses, run_sweep

pytestmark = pytest.mark.torchrun

STOPPED = "ds_optuna stopped the sweep: TrialFailedError: 1 of 1 trials of this run failed"


def _tracebacks_outside_torchrun(output: str) -> list[str]:
    blocks = output.split("Traceback (most recent call last):")[1:]
    return [b[:2000] for b in blocks if "ChildFailedError" not in b.split("\n=====", 1)[0]]


@pytest.mark.parametrize("kind", ["dict", "text"])
def test_a_task_returning_no_float_stops_the_sweep_with_one_message_and_a_hint(tmp_path, kind):
    res = run_sweep(tmp_path, "x=interval(-1,1)", f"fault.kind={kind}", "fault.rank=all", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert "return a float (or a sequence of floats, one per hydra.sweeper.direction, for multi-objective)" in res.output
    if kind == "dict":
        assert "such as metrics['eval_loss'] or metrics['epoch']" in res.output, res.output[-4000:]
    # rank 0's line, and torchrun's Root Cause (rank 0's error file): not once per rank, no traceback
    assert res.output.count(STOPPED) == 2, res.output[-6000:]
    root = res.output[res.output.index("Root Cause"):]
    assert STOPPED in root and "To enable traceback see" not in root, root
    assert _tracebacks_outside_torchrun(res.output) == [], res.output[-6000:]
    assert not re.search(r'File "[^"]*hydra_plugins', res.output), res.output[-6000:]
    assert "runs at world size 1" not in res.output  # started by torchrun: no notice (test_world_size_one_notice.py)


def test_without_torchrun_the_same_stop_is_one_message_and_exit_1(tmp_path):
    res = run_sweep(tmp_path, "x=interval(-1,1)", "fault.kind=dict", "fault.rank=all", nproc=1)
    assert res.returncode == 1
    assert res.output.count(STOPPED) == 1, res.output[-4000:]
    assert "Traceback (most recent call last)" not in res.output, res.output[-4000:]
