"""Pure rules that turn what each rank saw into one verdict per trial: no communication and no study, so every
rank gets the same answer from the same gathered lists and all ranks leave a trial together."""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from .._errors import RemoteError


class Outcome(str, enum.Enum):
    """How one trial ended on one rank (a ``str`` enum: it pickles and prints as its value)."""

    OK = "ok"
    FAILED = "failed"
    PRUNED = "pruned"
    #: ``SystemExit`` or ``KeyboardInterrupt`` inside the task; every rank then stops the sweep.
    INTERRUPTED = "interrupted"
    #: ``trial.should_preempt()`` answered True (SIGTERM, agreed by every rank): the task saved and stopped.
    PREEMPTED = "preempted"
    #: ``trial.should_preempt()`` answered True at the trial's ASHA rung: the task saved and stopped; stored PRUNED.
    PAUSED = "paused"


@dataclass(frozen=True)
class RankOutcome:
    """How one trial ended on one rank.

    Attributes:
        number: trial number.
        state: the :class:`Outcome`.
        values: the objective values this rank's task returned (``Outcome.OK`` only).
        error: the failure: a :class:`._errors.RemoteError` (its ``str`` is ``"TypeName: message"``) or
            that one-line text itself.
        seed_values: with ``hydra.sweeper.repeats > 1``, ``{seed: values}`` of each repeat.
        metrics: a refit run's metrics (:func:`refit_metrics`).
        signalled: SIGTERM reached this rank during the task (preemption), whether or not the task acted on it.
        step: with ``Outcome.PAUSED``, the rung (a step) the trial paused at.
    """

    number: int
    state: Outcome
    values: tuple[float, ...] | None = None
    error: RemoteError | str | None = None
    seed_values: dict[int, tuple[float, ...]] | None = None
    metrics: dict[str, float] | None = None
    signalled: bool = False
    step: int | None = None


@dataclass(frozen=True)
class Verdict:
    """What all ranks agree happened to one trial.

    Attributes:
        number: trial number.
        state: the Optuna state to tell: COMPLETE, PRUNED or FAIL.
        values: rank 0's objective values when COMPLETE, else None.
        error: why it failed, with the failing ranks named.
        interrupted: True when a rank was interrupted; every rank then stops the sweep.
        seed_values: rank 0's per-seed values (``repeats > 1``), stored as a user attribute.
        preempted: the task stopped on ``should_preempt()`` (state FAIL, stored as interrupted and
            re-queued; not a failure).
        signalled: SIGTERM reached some rank during the task: every rank stops the sweep after this round.
        paused_at: the ASHA rung (a step) the trial paused at (state PRUNED, kept for promotion), or ``None``.
    """

    number: int
    state: TrialState
    values: tuple[float, ...] | None
    error: str | None = None
    interrupted: bool = False
    seed_values: dict[int, tuple[float, ...]] | None = None
    metrics: dict[str, float] | None = None
    preempted: bool = False
    signalled: bool = False
    paused_at: int | None = None


def objective_values(ret: Any, n_objectives: int) -> tuple[float, ...]:
    """Turn a task's return value into ``n_objectives`` floats.

    Accepts a number (``int``, ``float``, a NumPy scalar, a 0-d array or tensor) or, one per
    objective, a list, tuple, 1-D NumPy array or 1-D tensor of numbers (case C37: an array of length 2
    was taken for one value).

    Raises:
        ValueError: if the task returned nothing, a value that is not a number (a string, a bool, a complex, a
            dict; case C37, optuna/optuna#1546), an array of 2 or more dimensions, the wrong number of values,
            or NaN (case C06, facebookresearch/hydra#2237: a NaN trial is told FAIL, never COMPLETE).
    """
    if ret is None:
        raise ValueError(f"the task returned None; it must return {n_objectives} number(s) (the objective): "
                         f"{_RETURN_HINT}")
    plain = _plain_value(ret)
    if isinstance(plain, list) and any(isinstance(item, list) for item in plain):
        raise ValueError(
            f"the task returned an array of shape {getattr(ret, 'shape', '?')} ({type(ret).__name__}); return "
            "a number, or one number per entry of hydra.sweeper.direction (a list, tuple or 1-D array)"
        )
    items = plain if isinstance(plain, list) else [plain]
    if len(items) != n_objectives:
        raise ValueError(
            f"the task returned {len(items)} value(s) ({ret!r}) but the study has {n_objectives} "
            "direction(s); return one number per entry of hydra.sweeper.direction"
        )
    values = []
    for item in items:
        if not _is_number(item):
            raise ValueError(f"the task returned {item!r} ({type(item).__name__}), not a number; {_RETURN_HINT}"
                             + _pick_hint(item))
        value = float(item)
        if math.isnan(value):
            raise ValueError("the task returned NaN")
        values.append(value)
    return tuple(values)


#: What every "not an objective" message ends with (issue 38, C59).
_RETURN_HINT = "return a float (or a sequence of floats, one per hydra.sweeper.direction, for multi-objective)"


def _pick_hint(item: Any) -> str:
    """For a mapping: name its numeric keys, e.g. ``" such as metrics['eval_loss']"``; else ``""``."""
    if not isinstance(item, dict):
        return ""
    keys = [k for k, v in item.items() if _is_number(v)][:3]
    return (" such as " + " or ".join(f"metrics[{k!r}]" for k in keys)) if keys else ""


def _plain_value(ret: Any) -> Any:
    """A (nested) list for a list, tuple or array/tensor of 1+ dimensions, a Python scalar for a 0-d one."""
    if isinstance(ret, (list, tuple)):
        return [_plain_value(item) for item in ret]
    ndim = getattr(ret, "ndim", None)
    if isinstance(ndim, int) and callable(getattr(ret, "tolist", None)):
        if ndim == 0 and callable(getattr(ret, "item", None)):
            return ret.item()
        return ret.tolist()
    return ret


def _is_number(value: Any) -> bool:
    """True for a real number that is not a bool (nor ``numpy.bool_``, nor a string that reads as a number)."""
    import numbers

    if isinstance(value, (bool, str, bytes, bytearray)) or type(value).__name__ == "bool_":
        return False
    # Real: int, float, Fraction, NumPy numbers; a Number that is not Complex: decimal.Decimal.
    return isinstance(value, numbers.Real) or (
        isinstance(value, numbers.Number) and not isinstance(value, numbers.Complex))


def refit_metrics(ret: Any) -> dict[str, float]:
    """A refit run's return value as ``{name: float}``: a number is ``{"value": x}``, a list
    ``{"value_0": ..., "value_1": ...}``, a dict keeps its keys. ``ValueError`` as :func:`objective_values`."""
    if isinstance(ret, dict) or (hasattr(ret, "items") and hasattr(ret, "keys")):
        items = [(str(k), v) for k, v in ret.items()]
    elif isinstance(_plain_value(ret), list):  # a list, tuple, or 1-D array or tensor (case C37)
        items = [(f"value_{i}", v) for i, v in enumerate(_plain_value(ret))]
    else:
        items = [("value", ret)]
    if not items:
        raise ValueError(f"the refit task returned {ret!r}: no metric")
    return {name: objective_values(v, 1)[0] for name, v in items}


def agree(number: int, outcomes: Sequence[RankOutcome]) -> Verdict:
    """Combine every rank's :class:`RankOutcome` of one trial into one :class:`Verdict`.

    A failure or interruption on any rank fails the trial; then a preemption closes it as preempted; then a
    pause at its ASHA rung (PRUNED, kept); then a prune on any rank prunes it; otherwise rank 0's values are the
    result. ``signalled`` is set when any rank got SIGTERM during the task. ``outcomes``: one per rank, by rank.
    """
    signalled = any(o.signalled for o in outcomes)
    bad = [(r, o) for r, o in enumerate(outcomes) if o.state in (Outcome.FAILED, Outcome.INTERRUPTED)]
    if bad:
        text = "; ".join(f"rank {r}: {o.error}" for r, o in bad)
        interrupted = any(o.state == Outcome.INTERRUPTED for _, o in bad)
        return Verdict(number, TrialState.FAIL, None, error=text, interrupted=interrupted, signalled=signalled)
    preempted = [o for o in outcomes if o.state == Outcome.PREEMPTED]
    if preempted:
        return Verdict(number, TrialState.FAIL, None, error=str(preempted[0].error), preempted=True, signalled=True)
    paused = [o for o in outcomes if o.state == Outcome.PAUSED]
    if paused:
        return Verdict(number, TrialState.PRUNED, None, error=str(paused[0].error), paused_at=paused[0].step,
                       signalled=signalled)
    if any(o.state == Outcome.PRUNED for o in outcomes):
        return Verdict(number, TrialState.PRUNED, None, signalled=signalled)
    first = outcomes[0]
    return Verdict(number, TrialState.COMPLETE, first.values, seed_values=first.seed_values, metrics=first.metrics,
                   signalled=signalled)


def combine_repeats(number: int, per_seed: Sequence[RankOutcome], seeds: Sequence[int]) -> RankOutcome:
    """One rank's outcome of a trial run once per seed (``hydra.sweeper.repeats``, facebookresearch/hydra#1969).

    The first interruption or failure wins, then a prune; otherwise the values are the mean over the seeds
    (each objective separately) and the per-seed values are kept. ``signalled`` is kept whatever the outcome.
    """
    signalled = any(o.signalled for o in per_seed)
    for state in (Outcome.INTERRUPTED, Outcome.FAILED, Outcome.PREEMPTED):
        bad = [(s, o) for s, o in zip(seeds, per_seed) if o.state == state]
        if bad:
            return RankOutcome(number, state, error="; ".join(f"seed {s}: {o.error}" for s, o in bad),
                               signalled=signalled)
    if any(o.state == Outcome.PRUNED for o in per_seed):
        return RankOutcome(number, Outcome.PRUNED, signalled=signalled)
    values = [o.values or () for o in per_seed]
    mean = tuple(sum(v[i] for v in values) / len(values) for i in range(len(values[0])))
    return RankOutcome(number, Outcome.OK, mean, seed_values={s: o.values or () for s, o in zip(seeds, per_seed)},
                       signalled=signalled)


def config_fingerprint(cfg: DictConfig) -> str:
    """SHA-256 of ``OmegaConf.to_yaml(cfg, resolve=True)``: equal configs, equal hashes, on any rank."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()


def flatten(container: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` for a nested dict/list container."""
    if isinstance(container, dict):
        items: Any = container.items()
    elif isinstance(container, list):
        items = enumerate(container)
    else:
        return {prefix: container}
    out: dict[str, Any] = {}
    for k, v in items:
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, (dict, list)) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def differing_keys(flat_configs: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose value is not the same in every flattened config (missing counts as different)."""
    keys = set().union(*flat_configs)
    return sorted(k for k in keys if any(f.get(k, KeyError) != flat_configs[0].get(k, KeyError) for f in flat_configs))
