"""The ``optuna.Trial`` that Optuna's artifact API gets on the first rank of a trial group other than group 0.

``optuna.artifacts.upload_artifact(study_or_trial=trial)`` and ``get_all_artifact_meta(trial)`` use two attributes
of the trial only: ``storage`` (``set_trial_system_attr``, ``get_trial_system_attrs``) and ``_trial_id``
(optuna/artifacts/_upload.py and _list_artifact_meta.py, Optuna 4-5). Another group's first rank holds no storage,
so its ``storage`` sends those calls to global rank 0's study service, for this trial only (case C53, optuna#6015);
the artifact's bytes are written by the caller's own artifact store.
"""

from __future__ import annotations

from typing import Any, Callable

import optuna

#: The storage calls of Optuna's artifact API, forwarded to global rank 0 (``storage.<name>`` trial calls).
ARTIFACT_STORAGE_CALLS = ("set_trial_system_attr", "get_trial_system_attrs")


class ForwardedStorage:
    """The calls of :data:`ARTIFACT_STORAGE_CALLS` on trial ``trial_id`` (the only id accepted); ``call(name,
    *args)`` runs ``storage.<name>(trial_id, *args)`` on global rank 0 and returns its result."""

    def __init__(self, trial_id: int, call: Callable[..., Any]) -> None:
        self._trial_id = int(trial_id)
        self._call = call

    def _check(self, trial_id: int) -> None:
        if int(trial_id) != self._trial_id:
            raise ValueError(f"this trial's storage forwards calls on its own trial (id {self._trial_id}) only, "
                             f"not on trial id {trial_id}")

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        """``BaseStorage.set_trial_system_attr`` of this trial, on global rank 0."""
        self._check(trial_id)
        self._call("storage.set_trial_system_attr", key, value)

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        """``BaseStorage.get_trial_system_attrs`` of this trial, on global rank 0."""
        self._check(trial_id)
        return dict(self._call("storage.get_trial_system_attrs"))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"a trial group's trial forwards only Optuna's artifact calls {ARTIFACT_STORAGE_CALLS} to global rank 0, "
            f"not storage.{name}: report, prune and suggest through current_trial()")


class ForwardedTrial(optuna.trial.Trial):
    """An ``optuna.Trial`` for Optuna's artifact API whose ``storage`` is a :class:`ForwardedStorage`; only
    ``number``, ``storage`` and ``_trial_id`` are set (``optuna.Trial.__init__`` would read the study)."""

    def __init__(self, number: int, trial_id: int, call: Callable[..., Any]) -> None:  # noqa: D107 (class docstring)
        self._number = int(number)
        self._trial_id = int(trial_id)
        self.storage = ForwardedStorage(trial_id, call)
        self.study = None

    @property
    def number(self) -> int:
        """The trial's number."""
        return self._number

    def __repr__(self) -> str:
        return f"ForwardedTrial(number={self._number}, trial_id={self._trial_id})"
