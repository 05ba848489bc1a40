"""``hydra.sweeper.custom_search_space`` functions and a sampler for the sweeper's own tests.

Used by ``tests/test_settings_coverage.py`` and ``tests/test_samplers_pruners.py``.
The test app runs as ``python tests/apps/sweep_app.py`` (or under torchrun), so this directory is on
``sys.path`` and the functions are named ``search_space_fns.<name>`` on the command line.

Each function has the signature the README promises, ``fn(cfg, trial)``, and is called by the
sweeper on rank 0 after the trial's params were sampled. What they see is stored as the trial's
user attributes, so a test reads it back from the study.
"""

import os
from pathlib import Path

import optuna

#: Bounds of the ``lr`` param that :func:`suggest_lr` adds (log-uniform).
LR_LOW, LR_HIGH = 1e-4, 1e-2


def suggest_lr(cfg, trial):
    """Add a dependent param ``lr`` (log-uniform in [1e-4, 1e-2]); it reaches the task as ``lr=<value>``.

    Stores as user attributes: ``fn_saw_params`` (the params already sampled when the function ran),
    ``fn_rank`` (the ``RANK`` of the process that ran it, "0" without torchrun) and ``fn_cfg_label``
    (``cfg.label``, showing the function got the composed config).
    """
    trial.set_user_attr("fn_saw_params", dict(trial.params))
    trial.set_user_attr("fn_rank", os.environ.get("RANK", "0"))
    trial.set_user_attr("fn_cfg_label", str(cfg.label))
    trial.suggest_float("lr", LR_LOW, LR_HIGH, log=True)


def fail(cfg, trial):
    """Raise, as a buggy search space function would."""
    raise ValueError("search space function broke on purpose")


def sigterm_at_trial_1(cfg, trial):
    """Send this process SIGTERM while rank 0 prepares trial 1 (after Optuna's ask, before the payload leaves
    rank 0): the window in which a signal closed a trial that no rank ran."""
    if trial.number == 1:
        import signal

        os.kill(os.getpid(), signal.SIGTERM)


def _sigterm_once_at(cfg, trial, marks):
    """SIGTERM this process when ``trial`` carries one of the system attributes ``marks``, once per sweep dir (the
    file ``sigterm_sent`` there)."""
    marker = Path(str(cfg.hydra.sweep.dir)) / "sigterm_sent"
    frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
    if any(frozen.system_attrs.get(k) for k in marks) and not marker.exists():
        import signal

        marker.touch()
        os.kill(os.getpid(), signal.SIGTERM)


def sigterm_at_the_first_continuation(cfg, trial):
    """Send this process SIGTERM while rank 0 prepares the first trial that continues another (an ASHA promotion,
    a retry: Optuna's ``retry_history``), once per sweep dir: the window in which the promoted configuration was
    closed never-ran and then neither counted nor continued."""
    _sigterm_once_at(cfg, trial, ("retry_history",))


def sigterm_at_the_first_queued_trial(cfg, trial):
    """The same for the first trial the ask took from the queue: a warm start (Optuna's ``fixed_params``) or a
    retry."""
    _sigterm_once_at(cfg, trial, ("fixed_params", "retry_history"))


def record_plots(cfg, trial):
    """Store ``{file name: mtime in ns}`` of the PNG files in ``<sweep dir>/plots`` as the user
    attribute ``plots_seen``: what the sweep had written before this trial ran (``{}``: nothing)."""
    plots = Path(str(cfg.hydra.sweep.dir)) / "plots"
    seen = {p.name: p.stat().st_mtime_ns for p in sorted(plots.glob("*.png"))} if plots.is_dir() else {}
    trial.set_user_attr("plots_seen", seen)


class FailingSampler(optuna.samplers.RandomSampler):
    """Optuna's ``RandomSampler`` whose relative sampling raises from trial 1 on, inside
    ``Study.ask``: what ``CmaEsSampler`` does when the ``cmaes`` package is missing
    (``ModuleNotFoundError`` from its first relative sample)."""

    def sample_relative(self, study, trial, search_space):
        if trial.number >= 1:
            raise ModuleNotFoundError("No module named 'not_installed_here' (FailingSampler, on purpose)")
        return super().sample_relative(study, trial, search_space)


class InterruptedSampler(optuna.samplers.RandomSampler):
    """Optuna's ``RandomSampler`` that raises ``KeyboardInterrupt`` while trial 1's second param is sampled inside
    ``Study.ask``: a Ctrl-C landing between the trial's creation and its tags, with one param stored (a new user
    hit it 3 times in 11)."""

    def sample_independent(self, study, trial, param_name, param_distribution):
        if trial.number == 1 and trial.params:
            raise KeyboardInterrupt
        return super().sample_independent(study, trial, param_name, param_distribution)


def x_below_half(frozen_trial):
    """A ``constraints_func`` for Optuna's constraint-aware samplers (TPE, NSGA-II, GP): feasible when
    ``x <= 0.5`` (Optuna's rule: every value <= 0 means feasible). Named in a config as
    ``{_target_: hydra.utils.get_method, path: search_space_fns.x_below_half}``."""
    return [frozen_trial.params["x"] - 0.5]
