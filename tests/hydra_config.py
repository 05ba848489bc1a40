"""A config composed by Hydra's real config loader, as the sweeper sees it, for in-process tests."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import DictConfig


def composed_with_group_options(conf_dir: Path, config_name: str) -> Iterator[tuple[DictConfig, Callable]]:
    """Yield ``(cfg, group_options)`` inside Hydra's initialised context: ``cfg`` is ``config_name`` composed
    with its hydra node; ``group_options(group, groups=False)`` lists the options of ``group`` (or, with
    ``groups=True``, the groups below that path), as the sweeper builds it from Hydra's loader."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name=config_name, return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()

        def group_options(group: str, groups: bool = False) -> list[str]:
            kind = ObjectType.GROUP if groups else ObjectType.CONFIG
            return loader.get_group_options(group, results_filter=kind, config_name=config_name, overrides=[])

        yield cfg, group_options
