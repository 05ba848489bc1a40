"""Pure pieces of the sweep loop: objective parsing, verdict agreement, config comparison.

Tables for the pure agreement rules of ``_loop/_agree.py`` (issue 39 item 4: rows that kill its mutants).

Each row states the rule from the module's docstrings: what a task may return as its objective(s) (case C37,
C06, C59), how the ranks' outcomes of one trial combine (a failure or interruption on any rank fails it, then a
preemption, then a prune, else rank 0's values), how repeats combine (the mean per objective), and how
configs are compared across ranks.
"""


import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._loop._agree import (
    Outcome,
    RankOutcome,
    Verdict,
    _is_number,
    _pick_hint,
    _plain_value,
    agree,
    combine_repeats,
    config_fingerprint,
    differing_keys,
    flatten,
    objective_values,
    refit_metrics,
)
from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
import decimal
import fractions
import hashlib
import numpy as np

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


OK, FAILED, PRUNED, INTERRUPTED, PREEMPTED = (Outcome.OK, Outcome.FAILED, Outcome.PRUNED, Outcome.INTERRUPTED,
                                              Outcome.PREEMPTED)
HINT = "return a float (or a sequence of floats, one per hydra.sweeper.direction, for multi-objective)"


class _Tensor0d:
    """A 0-d tensor as torch has it: ``ndim`` 0, ``item()`` and ``tolist()``."""
    ndim = 0

    def item(self):
        return 2.5

    def tolist(self):
        return 2.5


class _NoTolist:
    """Has an ``ndim`` but no ``tolist``: taken as it is (not a number)."""
    ndim = 1


@pytest.mark.parametrize("ret, n, expected", [
    (np.float32(0.25), 1, (0.25,)),             # NumPy scalar
    (np.array(1.5), 1, (1.5,)),                 # 0-d array
    (np.array([1.0, 2.0]), 2, (1.0, 2.0)),      # 1-D array, one per objective (C37)
    (_Tensor0d(), 1, (2.5,)),                   # 0-d tensor: item()
    (np.int64(7), 1, (7.0,)),
    (fractions.Fraction(1, 4), 1, (0.25,)),     # numbers.Real
    (decimal.Decimal("0.5"), 1, (0.5,)),        # a Number that is not Complex
    ((1, 2, 3), 3, (1.0, 2.0, 3.0)),
    (-0.0, 1, (-0.0,)),
    (float("inf"), 1, (float("inf"),)),         # only NaN is refused
])
def test_objective_values_reads_numbers_arrays_and_tensors(ret, n, expected):
    got = objective_values(ret, n)
    assert got == expected and all(type(v) is float for v in got)


@pytest.mark.parametrize("ret, n, message", [
    (None, 1, f"the task returned None; it must return 1 number(s) (the objective): {HINT}"),
    (None, 2, f"the task returned None; it must return 2 number(s) (the objective): {HINT}"),
    (float("nan"), 1, "the task returned NaN"),
    ([1.0, float("nan")], 2, "the task returned NaN"),
    ([1.0], 2, "the task returned 1 value(s) ([1.0]) but the study has 2 direction(s); return one number per "
               "entry of hydra.sweeper.direction"),
    (np.zeros((2, 2)), 2, "the task returned an array of shape (2, 2) (ndarray); return a number, or one number "
                          "per entry of hydra.sweeper.direction (a list, tuple or 1-D array)"),
    ([[1.0], [2.0]], 2, "the task returned an array of shape ? (list); return a number, or one number per entry "
                        "of hydra.sweeper.direction (a list, tuple or 1-D array)"),
    ("0.5", 1, f"the task returned '0.5' (str), not a number; {HINT}"),
    (True, 1, f"the task returned True (bool), not a number; {HINT}"),
    (np.bool_(True), 1, f"the task returned True (bool), not a number; {HINT}"),  # read with item() first
    (b"1", 1, f"the task returned b'1' (bytes), not a number; {HINT}"),
    (bytearray(b"1"), 1, f"the task returned bytearray(b'1') (bytearray), not a number; {HINT}"),
    (1j, 1, f"the task returned 1j (complex), not a number; {HINT}"),
    ({"eval_loss": 0.3, "epoch": 2, "name": "x", "acc": 0.9, "f1": 0.8}, 1,
     f"the task returned {{'eval_loss': 0.3, 'epoch': 2, 'name': 'x', 'acc': 0.9, 'f1': 0.8}} (dict), not a "
     f"number; {HINT} such as metrics['eval_loss'] or metrics['epoch'] or metrics['acc']"),  # C59: 3 keys at most
    ({"name": "x"}, 1, f"the task returned {{'name': 'x'}} (dict), not a number; {HINT}"),
])
def test_objective_values_refuses_with_the_exact_message(ret, n, message):
    with pytest.raises(ValueError) as err:
        objective_values(ret, n)
    assert str(err.value) == message


@pytest.mark.parametrize("item, hint", [
    ({"loss": 1.0}, " such as metrics['loss']"),
    ({"a": "x", "b": True, "c": 1}, " such as metrics['c']"),  # a bool is not a number
    ({}, ""),
    ([("loss", 1.0)], ""),                                      # only a mapping gets a hint
])
def test_pick_hint_names_up_to_three_numeric_keys(item, hint):
    assert _pick_hint(item) == hint


@pytest.mark.parametrize("ret, plain", [
    ((1, (2, 3)), [1, [2, 3]]),
    (np.array([[1, 2]]), [[1, 2]]),
    (np.array(3), 3),
    (_Tensor0d(), 2.5),
    ("ab", "ab"),
])
def test_plain_value(ret, plain):
    got = _plain_value(ret)
    assert got == plain and type(got) is type(plain)


class _NoItem:
    """A 0-d array-like without ``item()``: read with ``tolist()``."""
    ndim = 0

    def tolist(self):
        return 4.0


def test_plain_value_reads_a_0d_value_without_item_with_tolist():
    assert _plain_value(_NoItem()) == 4.0


def test_plain_value_keeps_an_object_without_tolist():
    obj = _NoTolist()
    assert _plain_value(obj) is obj


class bool_(int):  # noqa: N801  NumPy 1's name for its bool scalar type; an int here, refused by its name
    pass


@pytest.mark.parametrize("value, is_number", [
    (bool_(1), False),
    (1, True), (1.5, True), (np.float64(1), True), (fractions.Fraction(1, 3), True),
    (decimal.Decimal(1), True), (True, False), (np.bool_(False), False), ("1", False), (b"1", False),
    (bytearray(b"1"), False), (1j, False), (None, False), ([1], False),
])
def test_is_number(value, is_number):
    assert _is_number(value) is is_number


class _Metrics:
    """A mapping that is not a dict (e.g. a transformers output): has items() and keys()."""

    def items(self):
        return [("eval_loss", 0.5), (3, 1)]

    def keys(self):
        return ["eval_loss", 3]


@pytest.mark.parametrize("ret, metrics", [
    (0.5, {"value": 0.5}),
    (2, {"value": 2.0}),
    ([1, 2], {"value_0": 1.0, "value_1": 2.0}),
    (np.array([3.0, 4.0]), {"value_0": 3.0, "value_1": 4.0}),
    ({"acc": 0.9, "loss": np.float32(0.5)}, {"acc": 0.9, "loss": 0.5}),
    (_Metrics(), {"eval_loss": 0.5, "3": 1.0}),
])
def test_refit_metrics(ret, metrics):
    got = refit_metrics(ret)
    assert got == metrics and all(type(v) is float for v in got.values())


class _ItemsOnly:
    """Has ``items()`` but no ``keys()``: not a mapping, so not read as metrics."""

    def items(self):
        return [("a", 1.0)]

    def __repr__(self):
        return "<items only>"


@pytest.mark.parametrize("ret, message", [
    (_ItemsOnly(), f"the task returned <items only> (_ItemsOnly), not a number; {HINT}"),
    ({}, "the refit task returned {}: no metric"),
    ([], "the refit task returned []: no metric"),
    ({"acc": float("nan")}, "the task returned NaN"),
    (None, f"the task returned None; it must return 1 number(s) (the objective): {HINT}"),
])
def test_refit_metrics_refuses(ret, message):
    with pytest.raises(ValueError) as err:
        refit_metrics(ret)
    assert str(err.value) == message


def _o(state, values=None, error=None, **kw):
    return RankOutcome(7, state, values, error, **kw)


@pytest.mark.parametrize("outcomes, verdict", [
    # rank 0's values, seed values and metrics; the others' are not read
    ([_o(OK, (0.1,), seed_values={1: (0.1,)}, metrics={"m": 1.0}), _o(OK, (0.2,), metrics={"m": 2.0})],
     Verdict(7, TrialState.COMPLETE, (0.1,), seed_values={1: (0.1,)}, metrics={"m": 1.0})),
    ([_o(OK, (0.1,)), _o(OK, (0.2,), signalled=True)],
     Verdict(7, TrialState.COMPLETE, (0.1,), signalled=True)),
    # every failing rank is named, in rank order
    ([_o(FAILED, error="A: x"), _o(OK, (1.0,)), _o(FAILED, error="B: y")],
     Verdict(7, TrialState.FAIL, None, error="rank 0: A: x; rank 2: B: y")),
    ([_o(OK, (1.0,)), _o(INTERRUPTED, error="KeyboardInterrupt"), _o(FAILED, error="E: z", signalled=True)],
     Verdict(7, TrialState.FAIL, None, error="rank 1: KeyboardInterrupt; rank 2: E: z", interrupted=True,
             signalled=True)),
    # a failure beats a preemption; a preemption beats a prune
    ([_o(PREEMPTED, error="preempted (SIGTERM)", signalled=True), _o(FAILED, error="E: z")],
     Verdict(7, TrialState.FAIL, None, error="rank 1: E: z", signalled=True)),
    ([_o(PRUNED), _o(PREEMPTED, error="preempted (SIGTERM) (last reported step 3)"), _o(PREEMPTED, error="p2")],
     Verdict(7, TrialState.FAIL, None, error="preempted (SIGTERM) (last reported step 3)", preempted=True,
             signalled=True)),
    ([_o(OK, (1.0,)), _o(PRUNED)], Verdict(7, TrialState.PRUNED, None)),
    ([_o(PRUNED, signalled=True), _o(OK, (1.0,))], Verdict(7, TrialState.PRUNED, None, signalled=True)),
])
def test_agree(outcomes, verdict):
    assert agree(7, outcomes) == verdict


@pytest.mark.parametrize("per_seed, outcome", [
    # the mean per objective, the per-seed values kept by seed
    ([_o(OK, (1.0, 10.0)), _o(OK, (3.0, 20.0))],
     RankOutcome(7, OK, (2.0, 15.0), seed_values={5: (1.0, 10.0), 9: (3.0, 20.0)})),
    ([_o(OK, (1.0,)), _o(OK, (2.0,)), _o(OK, (6.0,))],
     RankOutcome(7, OK, (3.0,), seed_values={5: (1.0,), 9: (2.0,), 11: (6.0,)})),
    # the first interruption or failure wins (interrupted first), then a preemption, then a prune
    ([_o(FAILED, error="F"), _o(INTERRUPTED, error="KeyboardInterrupt"), _o(INTERRUPTED, error="SystemExit: 1")],
     RankOutcome(7, INTERRUPTED, error="seed 9: KeyboardInterrupt; seed 11: SystemExit: 1")),
    ([_o(OK, (1.0,)), _o(FAILED, error="E: a", signalled=True), _o(FAILED, error="E: b")],
     RankOutcome(7, FAILED, error="seed 9: E: a; seed 11: E: b", signalled=True)),
    ([_o(PRUNED), _o(PREEMPTED, error="preempted (SIGTERM)", signalled=True), _o(OK, (1.0,))],
     RankOutcome(7, PREEMPTED, error="seed 9: preempted (SIGTERM)", signalled=True)),
    ([_o(OK, (1.0,)), _o(PRUNED), _o(OK, (2.0,))], RankOutcome(7, PRUNED)),
    # SIGTERM during one seed's run is kept whatever the outcome (RankOutcome.signalled: "whether or not the
    # task acted on it"): the sweep must stop after this round
    ([_o(OK, (1.0,), signalled=True), _o(OK, (3.0,)), _o(OK, (5.0,))],
     RankOutcome(7, OK, (3.0,), seed_values={5: (1.0,), 9: (3.0,), 11: (5.0,)}, signalled=True)),
    ([_o(OK, (1.0,)), _o(PRUNED, signalled=True), _o(OK, (5.0,))], RankOutcome(7, PRUNED, signalled=True)),
])
def test_combine_repeats(per_seed, outcome):
    assert combine_repeats(7, per_seed, [5, 9, 11][:len(per_seed)]) == outcome


def test_config_fingerprint_is_the_sha256_of_the_resolved_yaml():
    cfg = OmegaConf.create({"x": 1, "r": "${x}", "m": {"lr": 0.1}})
    expected = hashlib.sha256(b"x: 1\nr: 1\nm:\n  lr: 0.1\n").hexdigest()
    assert config_fingerprint(cfg) == expected


@pytest.mark.parametrize("container, prefix, flat", [
    ({"a": {"b": {"c": 1}}, "d": [5, {"e": 6}]}, "", {"a.b.c": 1, "d.0": 5, "d.1.e": 6}),
    ({"a": {}, "b": [], "c": None}, "", {"a": {}, "b": [], "c": None}),  # an empty container is a leaf
    ([1, 2], "", {"0": 1, "1": 2}),
    ({"a": 1}, "cfg", {"cfg.a": 1}),
    (3, "k", {"k": 3}),
])
def test_flatten(container, prefix, flat):
    assert flatten(container, prefix) == flat


@pytest.mark.parametrize("flats, keys", [
    ([{"a": 1, "b": 2}, {"a": 1, "b": 3}], ["b"]),
    ([{"b": 1, "a": 1}, {"b": 2, "a": 2}], ["a", "b"]),           # sorted
    ([{"a": None}, {}], ["a"]),                                    # missing is not None
    ([{}, {"a": None}], ["a"]),
    ([{"a": 1}, {"a": 1}, {"a": 2}], ["a"]),                       # any config differing from the first
    ([{"a": 1}, {"a": 1}], []),
    ([{"a": 1, "b": None}], []),                                   # one config: nothing differs
])
def test_differing_keys(flats, keys):
    assert differing_keys(flats) == keys
