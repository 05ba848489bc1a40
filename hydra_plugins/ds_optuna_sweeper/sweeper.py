"""``hydra/sweeper=ds_optuna``: the thin Hydra plugin class. The loop (which imports optuna) is imported inside
:meth:`DSOptunaSweeper.__init__`: optuna and torch at top level add 1.3-1.6 s to every Hydra app's plugin scan
(docs/hydra-internals.md).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from . import config as _config  # noqa: F401  (registers hydra/sweeper=ds_optuna)


class DSOptunaSweeper(Sweeper):
    """Optuna sweeper for torchrun worlds: rank 0 asks and tells, every rank runs each trial. Hydra instantiates
    it from ``hydra.sweeper`` (keys: :class:`~hydra_plugins.ds_optuna_sweeper.config.DSOptunaSweeperConf`).

    Raises:
        SystemExit: status 1 from the constructor, on every rank, for any bad ``hydra.sweeper`` setting,
            after rank 0 logs the message (``_refusal.refusal_exit``); with ``HYDRA_FULL_ERROR=1``
            the ``SweeperConfigError`` itself.
    """

    def __init__(self, **kwargs: Any) -> None:
        from ._errors import DSOptunaSweeperError
        from ._refusal import refusal_exit
        from ._loop._sweep import Sweep
        from ._settings import Settings

        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        try:
            local = os.environ.get("LOCAL_WORLD_SIZE")
            settings = Settings.from_node(kwargs, world_size=world_size, local_world_size=int(local) if local else None)
        except DSOptunaSweeperError as e:
            # Every rank composed the same hydra.sweeper node, so every rank refuses it alike (no group yet).
            where = f"rank {os.environ.get('RANK', '0')}/{world_size}: hydra.sweeper refused"
            raise refusal_exit(e, where, world_size) from None
        self._sweep = Sweep(settings)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Called by Hydra on every rank before :meth:`sweep`.

        Makes the master config readable through ``HydraConfig`` first, so that
        ``hydra.sweep.dir=${hydra:runtime.cwd}/out`` resolves (case C51; ``_loop/_master_config.py``).
        """
        from ._loop._master_config import expose_master_config

        expose_master_config(config)
        self._sweep.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Optional[Any]:
        """Run the sweep over ``arguments`` (the command-line task overrides) on this rank."""
        return self._sweep.sweep(arguments)
