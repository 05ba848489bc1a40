"""Make Hydra's master config readable through ``HydraConfig`` while the sweep sets up (case C51).

``${hydra:runtime.cwd}`` (the ``hydra`` resolver) reads ``HydraConfig.get()``, which Hydra sets per job
(``hydra/core/utils.py`` ``run_job``) and in run mode, but not before a sweeper resolves
``hydra.sweep.dir``: ``hydra.sweep.dir=${hydra:runtime.cwd}/out`` failed with "HydraConfig was not set"
(hydra#2247, #3427). The master config carries ``hydra.runtime.cwd`` (``config_loader_impl.py``).
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig


def expose_master_config(config: DictConfig) -> None:
    """Set ``HydraConfig`` to a copy of the master ``config`` as the sweeper's ``setup`` receives it: a copy,
    because ``HydraConfig.set_config`` makes ``config.hydra`` read-only and the sweep still writes its master
    config. Each job sets its own (``run_job``) and puts this one back afterwards."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(copy.deepcopy(config))
