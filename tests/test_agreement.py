"""Pure pieces of the sweep loop: objective parsing, verdict agreement, config comparison."""


import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._loop._agree import (
    Outcome,
    RankOutcome,
    agree,
    config_fingerprint,
    differing_keys,
    flatten,
    objective_values,
)
from hydra_plugins.ds_optuna_sweeper._loop._ranks import RankComm

OK, FAILED, PRUNED, INTERRUPTED = Outcome.OK, Outcome.FAILED, Outcome.PRUNED, Outcome.INTERRUPTED


@pytest.mark.parametrize(
    "ret, n, expected",
    [(0.5, 1, (0.5,)), (3, 1, (3.0,)), ([1, 2.5], 2, (1.0, 2.5)), ((1.0,), 1, (1.0,))],
)
def test_objective_values_accepts_numbers(ret, n, expected):
    assert objective_values(ret, n) == expected


@pytest.mark.parametrize(
    "ret, n, fragment",
    [
        (None, 1, "returned None"),
        (float("nan"), 1, "NaN"),  # C06
        ([1.0], 2, "2 direction(s)"),
        ([1.0, 2.0], 1, "returned 2 value(s)"),
        ("high", 1, "not a number"),
    ],
)
def test_objective_values_refuses_what_cannot_be_told(ret, n, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        objective_values(ret, n)


def test_verdict_takes_rank0_values_when_all_ok():
    v = agree(4, [RankOutcome(4, OK, (0.9,)), RankOutcome(4, OK, (0.9,))])
    assert v.state == TrialState.COMPLETE and v.values == (0.9,)


def test_verdict_fails_when_any_rank_failed_and_names_it():
    v = agree(4, [RankOutcome(4, OK, (0.9,)), RankOutcome(4, FAILED, error="RuntimeError: oom")])
    assert v.state == TrialState.FAIL and v.values is None
    assert "rank 1: RuntimeError: oom" in v.error and not v.interrupted


def test_verdict_interrupt_wins_and_stops_everyone():
    v = agree(1, [RankOutcome(1, INTERRUPTED, error="KeyboardInterrupt"), RankOutcome(1, PRUNED)])
    assert v.state == TrialState.FAIL and v.interrupted


def test_verdict_pruned():
    assert agree(2, [RankOutcome(2, PRUNED), RankOutcome(2, PRUNED)]).state == TrialState.PRUNED


def test_fingerprint_and_differing_keys():
    a = OmegaConf.create({"x": 1, "n": {"lr": 0.1, "v": [1, 2]}, "r": "${x}"})
    b = OmegaConf.create({"x": 1, "n": {"lr": 0.2, "v": [1, 3]}, "r": "${x}"})
    assert config_fingerprint(a) == config_fingerprint(OmegaConf.create(OmegaConf.to_container(a)))
    assert config_fingerprint(a) != config_fingerprint(b)
    flats = [flatten(OmegaConf.to_container(c, resolve=True)) for c in (a, b)]
    assert differing_keys(flats) == ["n.lr", "n.v.1"]
    assert differing_keys([{"a": 1}, {"a": 1, "extra": None}]) == ["extra"]


def test_world_size_one_context_passes_objects_through():
    ctx = RankComm()
    assert ctx.is_main and not ctx.distributed
    payload = {"number": 3, "lr": 1e-4}
    assert ctx.broadcast(payload, what="x", trial=3) is payload
    assert ctx.all_gather(payload, what="x", trial=3) == [payload]
    assert "rank 0/1" in ctx.describe()
