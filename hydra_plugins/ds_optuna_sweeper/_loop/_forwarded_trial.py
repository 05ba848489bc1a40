"""The ``optuna.Trial`` that Optuna's artifact API gets on the first rank of a trial group other than group 0.

``optuna.artifacts.upload_artifact(study_or_trial=trial)`` and ``get_all_artifact_meta(trial)`` take an
``optuna.Trial`` and use two of its attributes only: ``storage`` (``set_trial_system_attr`` and
``get_trial_system_attrs`` of the trial's id) and ``_trial_id`` (optuna/artifacts/_upload.py and
_list_artifact_meta.py, Optuna 4-5; the FAQ "How can I save the model trained in each trial?"). Global rank
0 alone opens the study (docs/design.md, "One sampler"), so another group's first rank holds no storage: its
:class:`ForwardedTrial` is an ``optuna.Trial`` whose ``storage`` sends exactly those calls to global rank 0's
study service (:meth:`._study_service.StudyService.trial_call`), for this trial only (case C53, optuna#6015).
The artifact's bytes are written by the caller's own artifact store, here. optuna is imported at module level:
only :meth:`._remote_study.StudyTrial.optuna_trial` imports this module, inside a task.
"""

from __future__ import annotations

from typing import Any, Callable

import optuna

#: The storage calls of Optuna's artifact API, forwarded to global rank 0 (``storage.<name>`` trial calls).
ARTIFACT_STORAGE_CALLS = ("set_trial_system_attr", "get_trial_system_attrs")


class ForwardedStorage:
    """The calls of :data:`ARTIFACT_STORAGE_CALLS` on one trial, run on global rank 0's storage.

    Args:
        trial_id: the trial's storage id (the only id accepted).
        call: ``call(name, *args)`` runs ``storage.<name>(trial_id, *args)`` on global rank 0 and returns its
            result (:meth:`._study_handles.RemoteStudy.trial_call`).
    """

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
    """An ``optuna.Trial`` for Optuna's artifact API whose ``storage`` is a :class:`ForwardedStorage`.

    ``optuna.Trial.__init__`` is not run (it reads the study and calls the sampler): only ``number``,
    ``storage`` and ``_trial_id`` are set. Its other ``optuna.Trial`` methods are not for use: the task
    reports, prunes and suggests through :func:`current_trial` (a collective on every rank of the trial).
    """

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
