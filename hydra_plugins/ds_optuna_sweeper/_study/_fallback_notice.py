"""Optuna's "sampled independently" warning: said once, not once per trial (issue 38, C59).

A sampler that models the params jointly falls back to its independent sampler for a param it cannot model
and logs ``The parameter `c` in Trial#N is sampled independently using `RandomSampler` instead of
`CmaEsSampler` ...`` (``optuna/samplers/_base.py``, ``_INDEPENDENT_SAMPLING_WARNING_TEMPLATE``) in every trial.
A new user's ``hydra/sweeper/sampler=cmaes`` with a ``choice`` param got it every trial from trial 1 on.

Two parts, both on rank 0 (the only rank that samples):
- :func:`predicted_fallbacks`: ``CmaEsSampler`` never models a ``CategoricalDistribution``
  (``optuna/samplers/_cmaes.py``: "`CategoricalDistribution` are not supported"), so the sweeper says so once
  before trial 0 and builds the sampler with ``warn_independent_sampling=False``, unless the sampler node sets
  that argument itself.
- :func:`say_each_fallback_once`: for the fallbacks nobody can predict (a param suggested inside the task, a
  dynamic space for GP, QMC or multivariate TPE), Optuna's warning passes once per param and sampler, and
  its repeats (the same text but the trial number) are dropped.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

#: The sampler modules whose loggers emit the fallback warning (optuna 4.x/5.x).
SAMPLER_LOGGERS = ("optuna.samplers._cmaes", "optuna.samplers._qmc", "optuna.samplers._gp.sampler",
                   "optuna.samplers._tpe.sampler")
#: Samplers that never model categorical params (their ``_target_``).
NO_CATEGORICAL = ("optuna.samplers.CmaEsSampler",)
_TRIAL = re.compile(r"Trial#\d+")


def predicted_fallbacks(sampler_node: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The searched params ``sampler_node``'s class will sample independently in every trial.

    Args:
        sampler_node: the ``hydra.sweeper.sampler`` node (``_target_`` and its arguments).
        params: ``{name: ParamSpec}`` of the search space (each with a ``distribution``).

    Returns:
        The categorical params' names for a sampler of :data:`NO_CATEGORICAL` whose node does not set
        ``warn_independent_sampling``; else ``[]``.
    """
    from optuna.distributions import CategoricalDistribution

    if str(sampler_node.get("_target_", "")) not in NO_CATEGORICAL or "warn_independent_sampling" in sampler_node:
        return []
    return [name for name, spec in params.items() if isinstance(spec.distribution, CategoricalDistribution)]


def fallback_text(sampler_node: Mapping[str, Any], names: list[str]) -> str:
    """The one line said before trial 0 for :func:`predicted_fallbacks`' ``names``."""
    sampler = str(sampler_node.get("_target_", "")).rsplit(".", 1)[-1]
    listed = ", ".join(f"'{n}'" for n in names)
    return (f"{sampler} does not model categorical params: {listed} will be sampled independently (by its "
            f"independent sampler, RandomSampler by default) in every trial. Optuna's per-trial warning about it "
            f"is off; set +hydra.sweeper.sampler.warn_independent_sampling=true to have it back.")


class _OncePerParam(logging.Filter):
    """Passes a record once per text with its ``Trial#N`` taken out; drops the repeats."""

    def __init__(self) -> None:
        super().__init__("ds_optuna.fallback_once")
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "is sampled independently" not in text:
            return True
        key = _TRIAL.sub("Trial#", text)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


_FILTER = _OncePerParam()


def say_each_fallback_once() -> None:
    """Attach the once-per-param filter to the sampler loggers of :data:`SAMPLER_LOGGERS` (idempotent), and start
    its count afresh: each sweep (each study opened in this process) says each fallback once, not only the
    process's first one (a second sweep in one process, as in-process tests run them, said nothing)."""
    _FILTER.seen.clear()
    for name in SAMPLER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
