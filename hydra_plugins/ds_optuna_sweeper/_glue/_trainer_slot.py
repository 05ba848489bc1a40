"""The trainer slot: the one ``Trainer`` a trial scope holds until the trial ends. Standard library only."""

from __future__ import annotations

from typing import Any

from .._errors import GlueUsageError


class TrainerSlot:
    """One trial's Trainer, held until the trial's scope ends; the base of the glues' scopes
    (``TrialScope`` for transformers, ``LightningTrialScope`` for Lightning)."""

    scope_name = "trial scope"

    def __init__(self) -> None:
        self._trainer: Any = None

    def track(self, trainer: Any) -> Any:
        """Register ``trainer`` for release at the end of the scope and return it unchanged.

        Raises:
            GlueUsageError: (a ``RuntimeError``) if a Trainer is already tracked by this scope (one trial,
                one Trainer).
        """
        if self._trainer is not None:
            raise GlueUsageError(f"this {self.scope_name} already tracks a Trainer; use one scope per trial")
        self._trainer = trainer
        return trainer

    def _take(self) -> Any:
        trainer, self._trainer = self._trainer, None
        return trainer
