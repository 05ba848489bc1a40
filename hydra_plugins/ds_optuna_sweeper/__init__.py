"""hydra-ds-optuna-sweeper: one Optuna study driven from rank 0 of a torchrun world.

The public API, imported from here only::

    from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial, RankTrial
    from hydra_plugins.ds_optuna_sweeper import run_then_exit, exit_cleanly
    from hydra_plugins.ds_optuna_sweeper import build_training_arguments, trial_scope, pruning_callback  # [hf]
    from hydra_plugins.ds_optuna_sweeper import lightning_pruning_callback, lightning_trial_scope  # [lightning]

Hydra's plugin scanner re-executes, in place, every module here whose name does not start with ``_``
(hydra/core/plugins.py), so classes live in ``_`` modules and are only re-exported here: an ``except`` written
against a name imported before ``@hydra.main`` still matches after the scan. The training glue (``hf`` and
``lightning`` extras) is loaded on first use (PEP 562 ``__getattr__``, which the scan does not trigger), so
discovery imports no torch, optuna, transformers, deepspeed or lightning.
"""

from typing import Any

from ._errors import (
    CallMismatchError,
    ConfigMismatchError,
    ControlPlaneError,
    DSOptunaSweeperError,
    GlueConfigError,
    GlueUsageError,
    Interrupted,
    MetricNotLoggedError,
    MissingExtraError,
    PeerLostError,
    Preempted,
    ProcessGroupMisuseError,
    RankTimeoutError,
    SearchSpaceError,
    StorageUnavailableError,
    SweeperConfigError,
    SweepStoppedError,
    TrainingGroupBrokenError,
    TrialFailedError,
    TrialPreempted,
    UpstreamChangedError,
)
from ._task._handle import RankTrial
from ._task._process import exit_cleanly, run_then_exit
from ._task._slot import current_trial, in_trial

__version__ = "0.1.0"

#: Names served by the training glue, loaded on first use: {name: private module}.
_LAZY = {
    "build_training_arguments": "_hf",
    "deepspeed_config": "_hf",
    "trial_scope": "_hf",
    "TrialScope": "_hf",
    "teardown_trial": "_hf",
    "live_deepspeed_engines": "_hf",
    "pruning_callback": "_hf_pruning",
    "lightning_pruning_callback": "_lightning",
    "lightning_trial_scope": "_lightning",
    "LightningTrialScope": "_lightning",
}

#: {private module: (extra, packages it needs, what the glue is)}.
_EXTRAS = {
    "_hf": ("hf", ("transformers", "accelerate"), "the Hugging Face Trainer glue"),
    "_hf_pruning": ("hf", ("transformers", "accelerate"), "the Hugging Face Trainer glue"),
    "_lightning": ("lightning", ("lightning",), "the PyTorch Lightning glue"),
}

__all__ = [
    "current_trial",
    "in_trial",
    "RankTrial",
    "DSOptunaSweeperError",
    "SearchSpaceError",
    "SweeperConfigError",
    "RankTimeoutError",
    "ConfigMismatchError",
    "TrialFailedError",
    "TrialPreempted",
    "ControlPlaneError",
    "TrainingGroupBrokenError",
    "ProcessGroupMisuseError",
    "StorageUnavailableError",
    "Preempted",
    "CallMismatchError",
    "Interrupted",
    "GlueConfigError",
    "GlueUsageError",
    "MetricNotLoggedError",
    "MissingExtraError",
    "PeerLostError",
    "SweepStoppedError",
    "UpstreamChangedError",
    "exit_cleanly",
    "run_then_exit",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    """Load the training glue on first use of one of its names (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import importlib.util

    extra, packages, glue = _EXTRAS[module]
    missing = [pkg for pkg in packages if importlib.util.find_spec(pkg) is None]
    if missing:
        raise MissingExtraError(
            f"{name} is part of {glue}, which needs {', '.join(missing)}: install the extra with "
            f"pip install 'hydra-ds-optuna-sweeper[{extra}]' (from a clone: pip install './hydra-ds-optuna-sweeper"
            f"[{extra}]'; on a CPU machine repeat your torch pin in the same command, see the README)"
        )
    value = getattr(importlib.import_module(f"{__name__}._glue.{module}"), name)
    globals()[name] = value
    return value
