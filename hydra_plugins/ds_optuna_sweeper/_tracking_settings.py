"""``hydra.sweeper.tracking``, checked: which trackers, and each one's settings with its defaults resolved.

Only the standard library and omegaconf at module level: :class:`~._settings.Settings` builds this on every
rank before any process group exists, so a tracker that is not installed stops every rank with one message.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ._errors import MissingExtraError, SweeperConfigError

#: tracker name -> (the module it needs, the extra that installs it).
TRACKERS = {"mlflow": ("mlflow", "mlflow"), "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}

#: W&B's run modes (``wandb.init(mode=...)``, W&B docs "wandb.init").
WANDB_MODES = ("online", "offline", "disabled")


@dataclass(frozen=True)
class TrackingSettings:
    """The checked ``hydra.sweeper.tracking`` node: ``report_to``, the trackers in the order given (each of
    :data:`TRACKERS` at most once; empty: off), and each tracker's node as a plain dict (``None``: the default).
    """

    report_to: tuple[str, ...] = ()
    mlflow: dict[str, Any] = field(default_factory=dict)
    tensorboard: dict[str, Any] = field(default_factory=dict)
    wandb: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_node(cls, node: Any) -> "TrackingSettings":
        """Check ``hydra.sweeper.tracking`` (already merged onto its schema).

        Raises:
            SweeperConfigError: an unknown tracker name, one named twice, or a W&B mode that is not one of
                :data:`WANDB_MODES`.
            MissingExtraError: (an ``ImportError``) a named tracker whose package is not installed; the message
                gives the ``pip install`` line of its extra.
        """
        report_to = node.report_to
        names = [report_to] if isinstance(report_to, str) else list(report_to or [])
        names = [str(n).strip().lower() for n in names if str(n).strip().lower() not in ("", "none")]
        for name in names:
            if name not in TRACKERS:
                raise SweeperConfigError(
                    f"hydra.sweeper.tracking.report_to names {name!r}; the trackers are {', '.join(TRACKERS)} "
                    "(e.g. hydra.sweeper.tracking.report_to=[mlflow,tensorboard])")
            if names.count(name) > 1:
                raise SweeperConfigError(f"hydra.sweeper.tracking.report_to names {name!r} twice")
            module, extra = TRACKERS[name]
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError(
                    f"hydra.sweeper.tracking.report_to names {name}, but {module} is not installed: "
                    f"pip install 'hydra-ds-optuna-sweeper[{extra}]'")
        plain = {key: OmegaConf.to_container(node[key], resolve=True) for key in ("mlflow", "tensorboard", "wandb")}
        mode = plain["wandb"].get("mode")
        if mode is not None and mode not in WANDB_MODES:
            raise SweeperConfigError(
                f"hydra.sweeper.tracking.wandb.mode={mode!r}; use one of {', '.join(WANDB_MODES)} (null: W&B's default)")
        return cls(tuple(names), plain["mlflow"], plain["tensorboard"], plain["wandb"])

    def mlflow_uri(self, sweep_dir: str) -> str:
        """The MLflow tracking URI: ``tracking.mlflow.tracking_uri``, else ``sqlite:///<sweep_dir>/mlflow.db``
        (MLflow's SQL store in a file: nothing else has to run)."""
        return self.mlflow.get("tracking_uri") or f"sqlite:///{Path(sweep_dir).absolute()}/mlflow.db"

    def tensorboard_dir(self, sweep_dir: str) -> str:
        """The parent of the trials' TensorBoard event dirs: ``tracking.tensorboard.log_dir``, else
        ``<sweep_dir>/tensorboard``."""
        return str(Path(self.tensorboard.get("log_dir") or Path(sweep_dir) / "tensorboard").absolute())

    def wandb_dir(self, sweep_dir: str) -> str:
        """Where W&B writes (its ``wandb/`` folder below): ``tracking.wandb.dir``, else the sweep dir."""
        return str(Path(self.wandb.get("dir") or sweep_dir).absolute())
