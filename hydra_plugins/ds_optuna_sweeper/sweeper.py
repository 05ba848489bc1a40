"""``hydra/sweeper=ds_optuna``: the thin Hydra plugin class. The loop (which imports optuna) is imported inside
:meth:`DSOptunaSweeper.__init__`: optuna and torch at top level add 1.3-1.6 s to every Hydra app's plugin scan
(docs/hydra-internals.md).
"""

from __future__ import annotations

import copy
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
            after rank 0 logs the message (``_comm._refusal.refusal_exit``); with ``HYDRA_FULL_ERROR=1``
            the ``SweeperConfigError`` itself.
    """

    def __init__(self, **kwargs: Any) -> None:
        from ._errors import DSOptunaSweeperError
        from ._comm._refusal import refusal_exit
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

        Sets ``HydraConfig`` to a copy of the master config first (case C51): ``${hydra:runtime.cwd}`` reads
        ``HydraConfig.get()``, which Hydra sets per job (``run_job``, which puts this one back afterwards) but not
        before a sweeper resolves ``hydra.sweep.dir``, so ``hydra.sweep.dir=${hydra:runtime.cwd}/out`` failed with
        "HydraConfig was not set" (hydra#2247, #3427). A copy, because ``set_config`` makes ``config.hydra``
        read-only and the sweep still writes its master config.
        """
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(copy.deepcopy(config))
        self._sweep.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Optional[Any]:
        """Run the sweep over ``arguments`` (the command-line task overrides) on this rank."""
        return self._sweep.sweep(arguments)
