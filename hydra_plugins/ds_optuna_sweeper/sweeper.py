"""``hydra/sweeper=ds_optuna``: the thin Hydra plugin class.

Only hydra and omegaconf are imported here; the loop lives in ``_impl`` (imported in ``__init__``), so
Hydra's plugin scan in unrelated apps stays fast (NOTES-hydra.md: a plugin that imports optuna and
torch at top level adds 1.3-1.6 s to every Hydra app).
"""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from . import config as _config  # noqa: F401  (registers hydra/sweeper=ds_optuna)


class DSOptunaSweeper(Sweeper):
    """Optuna sweeper for torchrun worlds: rank 0 asks and tells, every rank runs each trial.

    Hydra instantiates it from ``hydra.sweeper`` (see
    :class:`~hydra_plugins.ds_optuna_sweeper.config.DSOptunaSweeperConf` for the keys).
    """

    def __init__(self, **kwargs: Any) -> None:
        settings = _config.validate_sweeper_config(kwargs)
        from ._impl import SweepRunner

        self._runner = SweepRunner(settings)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Called by Hydra on every rank before :meth:`sweep`."""
        self._runner.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Optional[Any]:
        """Run the sweep over ``arguments`` (the command-line task overrides) on this rank."""
        return self._runner.sweep(arguments)
