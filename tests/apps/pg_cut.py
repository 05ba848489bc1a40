"""Task side of the storage-outage tests (case C35): cut the sweeper's PostgreSQL connections on purpose.

Configured by the test through the environment (rank 0 only acts):

- ``DSO_C35_CUTS``: comma-separated cut points: ``setup`` (right after ``optuna.create_study`` returned
  in the sweeper's set-up, inside its first-contact lock), ``ask`` (inside ``study.ask``, when the
  sampler's ``before_trial`` runs, after the trial was created), ``report`` (before the task's report at
  step 1), ``end`` (before the task returns, so the tell and the next ask meet the cut), ``results``
  (before ``optimization_results.yaml`` is written);
- ``DSO_C35_FROM_TRIAL``: the task's cuts (``report``, ``end``) start at this trial number;
- ``DSO_C35_OUTAGE_S``: seconds the proxy (``tests/pg_outage.py``) refuses new connections after each cut;
- ``DSO_PG_DOWN_FILE``, ``DSO_PG_ADMIN_URL``, ``DSO_PG_APP_NAME``: the proxy's down file, the real
  server's URL, the sweeper's ``application_name`` tag (only those connections are terminated);
- ``DSO_C35_CUT_LOG``: one JSON line per cut: ``{"label", "terminated"}``.

The hooks wrap the real functions and call them unchanged (like the C01 spy in ``sweep_app.py``). The switches
are read when a cut point is reached, and :func:`install_hooks` takes the setter to use, so that a test running
the app in process (``tests/test_storage_outage.py``) installs the hooks with ``monkeypatch.setattr`` and has
them undone after it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.pg_outage

from tests.pg_outage import down, terminate_tagged  # noqa: E402


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _cuts() -> set[str]:
    return {c for c in os.environ.get("DSO_C35_CUTS", "").split(",") if c}


def cut(label: str) -> None:
    """Make the proxy refuse new connections for ``DSO_C35_OUTAGE_S`` s and terminate the sweeper's backends."""
    down(Path(os.environ["DSO_PG_DOWN_FILE"]), float(os.environ.get("DSO_C35_OUTAGE_S", "2")))
    n = terminate_tagged(os.environ["DSO_PG_ADMIN_URL"], os.environ["DSO_PG_APP_NAME"])
    with open(os.environ["DSO_C35_CUT_LOG"], "a") as f:
        f.write(json.dumps({"label": label, "terminated": n}) + "\n")


def cut_here(label: str, trial_number: int) -> None:
    """``cut(label)`` on rank 0 when ``label`` is one of ``DSO_C35_CUTS`` and ``trial_number`` is at
    least ``DSO_C35_FROM_TRIAL`` (default 0)."""
    if _rank() == 0 and label in _cuts() and trial_number >= int(os.environ.get("DSO_C35_FROM_TRIAL", "0")):
        cut(f"{label} {trial_number}")


def install_hooks(set_attribute=setattr) -> None:
    """Rank 0: cut at ``setup``, ``ask`` and ``results`` (see the module docstring), each hook installed with
    ``set_attribute(owner, name, hook)``."""
    if _rank() != 0:
        return
    import optuna

    cuts = _cuts()

    if "setup" in cuts:
        real_create = optuna.create_study
        done = []

        def create_study(*args, **kwargs):
            study = real_create(*args, **kwargs)
            if not done:
                done.append(1)
                cut("setup")
            return study

        set_attribute(optuna, "create_study", create_study)
    if "ask" in cuts:
        real_before = optuna.samplers.TPESampler.before_trial

        def before_trial(self, study, trial):
            cut(f"ask {trial.number}")
            return real_before(self, study, trial)

        set_attribute(optuna.samplers.TPESampler, "before_trial", before_trial)
    if "results" in cuts:
        from hydra_plugins.ds_optuna_sweeper._study import _results

        real_write = _results.write_results

        def write_results(*args, **kwargs):
            cut("results")
            return real_write(*args, **kwargs)

        set_attribute(_results, "write_results", write_results)
