"""A setting refused before trial 0 ends every rank the same way (issue 22, item 4).

Two ranks under real torchrun, with a YAML mapping under ``hydra.sweeper.params`` (rank 0 refuses it while
building the search space, before the study is asked anything). Rank 0 prints the message once (issue 38, C59:
once per rank buried it), every rank exits 1, no traceback runs through the sweeper's code, and torchrun's
"Root Cause" shows the message; with Hydra's ``HYDRA_FULL_ERROR=1`` every rank raises the same exception type
instead.
"""

import re

import pytest

from tests.multirank.sweep_helpers import LINGER, create_study, exit_lines, exit_statuses, load, run_sweep

pytestmark = pytest.mark.torchrun

MAPPING = "hydra.sweeper.params={x:{a:1}}"
MESSAGE = "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'x' is a YAML mapping"


def _tracebacks_outside_torchrun(output: str) -> list[str]:
    """The tracebacks in ``output`` other than torchrun's own ``ChildFailedError`` report (torchrun prints
    one whenever a rank exits non-zero; it runs through torch's launcher only)."""
    blocks = output.split("Traceback (most recent call last):")[1:]
    return [b[:2000] for b in blocks if "ChildFailedError" not in b.split("\n=====", 1)[0]]


def test_a_mapping_under_params_prints_its_message_once_and_exits_non_zero_without_a_traceback(tmp_path):
    study = create_study(tmp_path)
    attrs_before = dict(study.user_attrs)
    res = run_sweep(tmp_path, "hydra.sweeper.plots=false", MAPPING, env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    # once by rank 0, once more in torchrun's report (rank 0's error file)
    assert res.output.count("Sweep set-up failed on rank 0: SearchSpaceError: " + MESSAGE) == 2, res.output[-6000:]
    assert res.output.count(MESSAGE) == 2, res.output[-6000:]
    assert "could not start the sweep" not in res.output  # rank 1 says nothing of its own
    assert _tracebacks_outside_torchrun(res.output) == [], res.output[-6000:]
    assert not re.search(r'File "[^"]*hydra_plugins', res.output), res.output[-6000:]
    assert "Error executing job" not in res.output
    assert not (tmp_path / "records").exists()  # no rank ran the task
    after = load(tmp_path)
    assert after.trials == [] and dict(after.user_attrs) == attrs_before  # the study is untouched


@pytest.mark.soak  # make test: the refusal contract launch above (issue 39)
def test_with_hydra_full_error_every_rank_raises_the_same_type_and_message(tmp_path):
    res = run_sweep(tmp_path, "hydra.sweeper.plots=false", MAPPING, env={**LINGER, "HYDRA_FULL_ERROR": "1"})
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    raised = re.findall(r"^(?:\[rank\d\]: )?(?:hydra_plugins\.ds_optuna_sweeper\._errors\.)?(\w+Error): (.*)$", res.output, re.M)
    refused = [r for r in raised if MESSAGE in r[1]]
    assert len(refused) == 2, res.output[-6000:]  # one traceback per rank
    assert {name for name, _ in refused} == {"SearchSpaceError"}
    assert refused[0][1] == refused[1][1]
