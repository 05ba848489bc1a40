"""Everything the sweeper stores in an Optuna study or trial: one table, and the schema version.

The study is the source of truth of a sweep (docs/how-to/checkpoints.md, "Resume"): it outlives the process that
wrote it and the version of this package. This module is the one list of the attributes the sweeper writes and
reads (:data:`STORED_KEYS`: what each means, who writes and who reads it), so a change to any of them is a change
here (and to :data:`SCHEMA_VERSION` when a stored study would be read differently). Code that writes or reads one
of these keys imports its name from here, but for :data:`STEPS_ATTR`: the task side writes it and imports nothing
of the study side, so its name is defined in :mod:`.._task._slot` and imported here.

Schema versions (the study user attribute :data:`SCHEMA_VERSION_ATTR`):

- 1: the schema of every study written before the attribute existed (a study without it is
  version 1). ``tests/data/study_ea58e40.db`` is such a study, written by main at ``ea58e40``.
- 2: the same keys, plus :data:`SCHEMA_VERSION_ATTR` itself, stored when the sweeper opens the study.
- 3: plus the checkpoint keys (:data:`CHECKPOINT_DIR_ATTR`, :data:`CONTINUES_ATTR`,
  :data:`INTERRUPTED_ATTR`, :data:`RESUMED_FROM_ATTR`). A version-2 study reads the same: its trials
  simply have no checkpoint directory recorded (a retry of one gets a new directory).
- 4: plus :data:`PAUSED_ATTR` (``hydra/sweeper/scheduler=asha`` and ``pbt``) and :data:`PBT_CLONE_ATTR`. A
  version-3 study reads the same: it has no paused trial. An older sweeper reading a version-4 study sees a paused
  trial as PRUNED and counts a promoted one in ``n_trials`` beside its continuation.

Optuna's own keys the sweeper writes or reads are listed too (``owner="optuna"``): a new Optuna that renames one
breaks what the study means to the sweeper.

Imports nothing but the standard library and :mod:`.._task._slot` (itself the standard library only at module
level); the stored-attributes page (docs/reference/stored.md) is generated from :data:`STORED_KEYS` (:func:`markdown_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._task._slot import STEPS_ATTR

#: The schema this version of the sweeper writes. A study without :data:`SCHEMA_VERSION_ATTR` is version 1.
SCHEMA_VERSION = 4
#: The version of a study that holds no :data:`SCHEMA_VERSION_ATTR` (written before it existed).
UNVERSIONED = 1

# Study user attributes.
SCHEMA_VERSION_ATTR = "ds_optuna:schema_version"
RUNS_ATTR = "ds_optuna:runs"

# Trial user attributes.
GROUP_ATTR = "ds_optuna:group"
TRIAL_GROUP_ATTR = "ds_optuna:trial_group"
FIXED_OVERRIDES_ATTR = "ds_optuna:fixed_overrides"
OVERRIDE_PARAMS_ATTR = "ds_optuna:override_params"
ENQUEUED_ATTR = "ds_optuna:enqueued"
SEED_VALUES_ATTR = "ds_optuna:seed_values"
GPU_PEAK_ATTR = "gpu_peak_allocated_bytes"
CHECKPOINT_DIR_ATTR = "ds_optuna:checkpoint_dir"
CONTINUES_ATTR = "ds_optuna:continues"
INTERRUPTED_ATTR = "ds_optuna:interrupted"
NEVER_RAN_ATTR = "ds_optuna:never_ran"
PAUSED_ATTR = "ds_optuna:paused_at"
PBT_SEED_ATTR = "ds_optuna:pbt_seed"
PBT_CLONE_ATTR = "ds_optuna:pbt_clone"
RESUMED_FROM_ATTR = "ds_optuna:resumed_from"

# Trial system attributes.
TOKEN_ATTR = "ds_optuna:create_token"
OWNER_ATTR = "ds_optuna:owner"
FIXED_PARAMS_ATTR = "fixed_params"
FAILED_TRIAL_ATTR = "failed_trial"
RETRY_HISTORY_ATTR = "retry_history"
GRID_ID_ATTR = "grid_id"
GRID_SPACE_ATTR = "search_space"


@dataclass(frozen=True)
class StoredKey:
    """One attribute the sweeper stores or reads in a study.

    Attributes:
        key: the attribute's name in the storage.
        level: ``"study"`` or ``"trial"``.
        kind: ``"user"`` (``user_attrs``, shown by Optuna's dashboards) or ``"system"`` (``system_attrs``).
        writer: the module(s) and function that write it.
        reader: the module(s) and function that read it (``"user"``: only people and their tools).
        type: the stored value's Python type.
        doc: what it means.
        owner: ``"ds_optuna"`` (the sweeper's own key) or ``"optuna"`` (Optuna's, written or read by the sweeper).
    """

    key: str
    level: str
    kind: str
    writer: str
    reader: str
    type: str
    doc: str
    owner: str = "ds_optuna"


#: Every attribute the sweeper stores in or reads from a study, study level first.
STORED_KEYS: tuple[StoredKey, ...] = (
    StoredKey(SCHEMA_VERSION_ATTR, "study", "user", "_study.open_study", "_study.open_study (stored_version)", "int",
              "schema version of the newest sweeper that opened the study; absent = 1"),
    StoredKey(RUNS_ATTR, "study", "user", "_study.open_study (_count_run)", "_study.open_study (run_seed)", "int",
              "runs that opened the study (sweeps, torchrun restarts, groups); seeds each run's sampler"),
    StoredKey(GROUP_ATTR, "trial", "user", "_driver (ask)", "_abandon.own_running_trials, _tell.close_orphan", "str",
              "id of the torchrun group that ran the trial (a restarted group closes its own)"),
    StoredKey(TRIAL_GROUP_ATTR, "trial", "user", "_driver (ask)", "_results.summary_table", "int",
              "trial group of the launch that ran the trial (hydra.sweeper.n_jobs inside a torchrun world)"),
    StoredKey(FIXED_OVERRIDES_ATTR, "trial", "user", "_driver (ask)", "_command.trial_overrides", "list[str]",
              "fixed overrides of the run that asked the trial (its rerun line)"),
    StoredKey(OVERRIDE_PARAMS_ATTR, "trial", "user", "_driver (ask)", "_command.split_params", "list[str]",
              "params custom_search_space added that are config overrides (rerun line)"),
    StoredKey(ENQUEUED_ATTR, "trial", "user", "_queue.enqueue_warm_starts", "_queue.warm_start_runs (refit)", "bool",
              "queued by hydra.sweeper.enqueue_trials (a warm start)"),
    StoredKey(SEED_VALUES_ATTR, "trial", "user", "_driver (tell)", "user", "dict[str, list[float]]",
              "per-seed values when repeats > 1; the trial's value is their mean"),
    StoredKey(GPU_PEAK_ATTR, "trial", "user", "_memory (rank 0)", "_driver (log line), _results.summary_table", "int",
              "rank 0's peak allocated GPU memory in bytes (CUDA only)"),
    StoredKey(STEPS_ATTR, "trial", "user", "_slot.record_optimizer_steps (HF, Lightning glue)", "user", "int",
              "optimizer steps the trial ran"),
    StoredKey(CHECKPOINT_DIR_ATTR, "trial", "user", "_driver (ask)", "_driver (ask of a retry), _retention", "str",
              "the trial's checkpoint directory, the same for its retries (trial.checkpoint_dir)"),
    StoredKey(CONTINUES_ATTR, "trial", "user", "_driver (ask)", "_results.summary_table", "int",
              "number of the trial this retry continues (its checkpoint and intermediate values)"),
    StoredKey(INTERRUPTED_ATTR, "trial", "user", "_tell.mark_stop", "_stored.shown_state, _asha", "str",
              "why the trial was interrupted (SIGTERM, acknowledged by the task); stored FAIL, re-queued; not "
              "copied into its retry (_abandon._unshared)"),
    StoredKey(NEVER_RAN_ATTR, "trial", "user", "_abandon.close_never_ran", "_queue, _asha, _stored.shown_state",
              "bool",
              "closed FAIL before its payload left rank 0 (a signal or an error in its ask, custom_search_space or "
              "its round's next ask): it never ran, so n_trials does not count it and it continues no trial; one the "
              "ask took from the queue is queued again"),
    StoredKey(PAUSED_ATTR, "trial", "user", "_tell.mark_stop", "_asha (promotion), _stored.shown_state", "int",
              "the ASHA rung (a step) the trial paused at; stored PRUNED, with its checkpoint kept; a promoted "
              "trial's continuation is its retry (null there until it pauses)"),
    StoredKey(PBT_SEED_ATTR, "study", "user", "_pbt.study_seed", "_pbt.study_seed", "int",
              "PBT: the seed of the random draws (the sampler's seed, else random), kept across resumes"),
    StoredKey(PBT_CLONE_ATTR, "trial", "user", "_pbt (queued clone)", "_pbt.schedule, _results", "dict",
              "PBT: the member whose checkpoint this trial copied (from_trial, checkpoint, donor_step), at which "
              "step of its own (at_step), and the params changed ({param: [old, new]})"),
    StoredKey(RESUMED_FROM_ATTR, "trial", "user", "_driver (ask)", "user", "str",
              "the checkpoint a retried trial resumed from (trial.resume_from)"),
    StoredKey(TOKEN_ATTR, "trial", "system", "_retry (create_new_trial)", "_retry (after a dropped commit)", "str",
              "random token that finds a trial whose creation may or may not have committed"),
    StoredKey(OWNER_ATTR, "trial", "system", "_driver (ask)", "_owners.close_orphans (study open)", "str",
              "launch id of the rank 0 running the trial; a RUNNING trial whose owner lock is free is closed"),
    StoredKey(FIXED_PARAMS_ATTR, "trial", "system", "_queue.enqueue_warm_starts; Optuna's enqueue_trial",
              "_study (warm starts), _grid; Optuna's samplers", "dict[str, Any]",
              "params an enqueued trial takes", owner="optuna"),
    StoredKey(FAILED_TRIAL_ATTR, "trial", "system", "_queue.enqueue_warm_starts; Optuna's RetryFailedTrialCallback",
              "_queue.counted_trials", "int", "first trial of a retried lineage (a retry replaces it in n_trials)",
              owner="optuna"),
    StoredKey(RETRY_HISTORY_ATTR, "trial", "system", "_queue.enqueue_warm_starts; Optuna's RetryFailedTrialCallback",
              "_queue.counted_trials", "list[int]", "every trial a retry retries", owner="optuna"),
    StoredKey(GRID_ID_ATTR, "trial", "system", "_grid.WarmStartGridSampler; Optuna's GridSampler", "_grid", "int",
              "index of the trial's grid point", owner="optuna"),
    StoredKey(GRID_SPACE_ATTR, "trial", "system", "_grid.WarmStartGridSampler; Optuna's GridSampler", "_grid",
              "dict[str, list]", "the grid the trial's grid_id indexes", owner="optuna"),
)


def shown_state(state_name: str, user_attrs: dict, continued: bool = False) -> str:
    """A trial's state for people: ``INTERRUPTED`` for a FAIL trial marked :data:`INTERRUPTED_ATTR` (Optuna has
    no such state; samplers and ``max_failure_rate`` treat it apart from a failure), ``NEVER_RAN`` for one marked
    :data:`NEVER_RAN_ATTR` (closed before any rank ran it; not counted in ``n_trials``), ``PAUSED`` for a PRUNED
    trial marked :data:`PAUSED_ATTR` (an ASHA rung), ``PROMOTED`` for one a later trial continues (``continued``),
    else Optuna's name."""
    if state_name == "PRUNED" and user_attrs.get(PAUSED_ATTR) is not None:
        return "PROMOTED" if continued else "PAUSED"
    if state_name == "FAIL" and user_attrs.get(NEVER_RAN_ATTR):
        return "NEVER_RAN"
    return "INTERRUPTED" if state_name == "FAIL" and user_attrs.get(INTERRUPTED_ATTR) else state_name


def stored_version(user_attrs: dict) -> int:
    """The schema version of a study with these study user attributes (:data:`UNVERSIONED` without one)."""
    return int(user_attrs.get(SCHEMA_VERSION_ATTR, UNVERSIONED))


def markdown_table() -> str:
    """:data:`STORED_KEYS` as the Markdown table of docs/reference/stored.md (one line per key; docs/gen_reference.py writes it there)."""
    lines = ["| key | level | kind | written by | read by | type | meaning |", "|---|---|---|---|---|---|---|"]
    for k in STORED_KEYS:
        who = "" if k.owner == "ds_optuna" else " (Optuna's)"
        lines.append(f"| `{k.key}`{who} | {k.level} | {k.kind} | {k.writer} | {k.reader} | `{k.type}` | {k.doc} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m hydra_plugins.ds_optuna_sweeper._study._stored: the stored-keys page's table
    print(markdown_table())
