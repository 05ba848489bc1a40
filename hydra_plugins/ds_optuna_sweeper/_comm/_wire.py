"""Every message the sweeper's ranks exchange (:data:`MESSAGES`, over each world's gloo control group) and every
key it writes in torchrun's store (:data:`STORE_KEYS`): one table (docs/design.md, "What crosses between ranks").
No other module spells a store key or prefix (``tests/test_structure_measure.py`` fails when one does).

The three stores: **launch**, torchrun's own store, unprefixed (keys that must outlive a ``--max-restarts``
restart); **attempt** (:func:`attempt_prefix`), one world's control keys for one torchrun attempt; **world**
(:func:`world_prefix`), the whole launch's keys when it runs trial groups (``n_jobs`` above 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class StoreKey:
    """One key of torchrun's store: its ``pattern`` (``<...>`` for the parts filled in), the ``store`` that holds it
    (module docstring: ``launch``, ``attempt`` or ``world``), its ``writer`` and its ``readers`` (and why)."""

    pattern: str
    store: str
    writer: str
    readers: str


@dataclasses.dataclass(frozen=True)
class Message:
    """One message over a world's gloo control group: the ``name`` (``what``) it travels under, its ``shape``
    (``broadcast``: rank 0 -> all, or ``all_gather``: all -> all), the pickled ``value``, and ``when`` it is sent."""

    name: str
    shape: str
    value: str
    when: str


MESSAGES: tuple[Message, ...] = (
    Message("sweep set-up", "broadcast", "_loop._messages.Setup", "once, before trial 0"),
    Message("trial payload", "broadcast", "_loop._messages.Command (RUN with payloads, STOP, or WAIT: ask again)",
            "once per round"),
    Message("config check", "all_gather", "a hash of the resolved config, then the differing keys", "each job's start"),
    Message("report / should_prune / should_preempt / suggest_*", "broadcast or all_gather",
            "rank 0's answer or the exception Optuna raised; should_preempt: every rank's SIGTERM flag, OR-ed",
            "each call of the task"),
    Message("trial result", "all_gather", "_loop._agree.RankOutcome per trial", "end of each round"),
    Message("refit payload / refit result", "broadcast / all_gather", "as the trial's", "each refit run"),
)

STORE_KEYS: tuple[StoreKey, ...] = (
    StoreKey("ds_optuna/group_id", "launch", "rank 0 at the first attempt (_loop._group)",
             "rank 0 after a restart: its own RUNNING trials (C54)"),
    StoreKey("ds_optuna/sweep_dir/<run id>", "launch", "rank 0 at the first attempt (_loop._sweep)",
             "every rank after a restart: the first attempt's sweep dir (C50)"),
    StoreKey("ds_optuna/arrived/<what>/<trial>/<rank>", "attempt", "each rank at a gather (_comm._arrivals)",
             "a rank that timed out: who never came"),
    StoreKey("ds_optuna/host/<rank>", "attempt", "each rank when its world is set up (_comm._arrivals.announce_host)",
             "a rank whose peer is absent or lost: which node and address it was on (issue 42)"),
    StoreKey("ds_optuna/launch_end", "attempt",
             "the first rank that stops the launch: its task failed with peers blocked, a signal, an error (_comm._launch_end)",
             "rank 0: the trial's state; every rank: its exit status; a peer whose wait broke: why (C41, C45)"),
    StoreKey("ds_optuna/results_written", "attempt", "rank 0 after the results, one trial group (_comm._long_waits)",
             "the other ranks, before they leave"),
    StoreKey("calls/<trial>.<run>/at/<rank>", "attempt", "each rank at a trial call (_comm._arrivals)",
             "peers at the same call: where a rank is (C34)"),
    StoreKey("calls/<trial>.<run>/<n>/<label>/<rank>", "attempt", "each rank at its n-th trial call (_comm._arrivals)",
             "peers: the same call at the same position"),
    StoreKey("setup", "world", "global rank 0 (_loop._study_service)", "every trial group's first rank"),
    StoreKey("rpc/req", "world", "each trial group's first rank (a queue)", "global rank 0's study service"),
    StoreKey("rpc/rep/<group>", "world", "global rank 0's study service (a queue)", "that group's first rank"),
    StoreKey("ds_optuna/results_written", "world", "global rank 0 after the results, trial groups (_comm._long_waits)",
             "every rank of every group, before it leaves"),
)


# --- store prefixes --------------------------------------------------------------------------------------

def attempt_prefix(attempt: int) -> str:
    """The attempt store's prefix: one world's control keys for torchrun attempt ``attempt``."""
    return f"ds_optuna/control_{attempt}"


def rendezvous_prefix(attempt: int) -> str:
    """The prefix under which the default process group of attempt ``attempt`` meets (torch's own keys)."""
    return f"ds_optuna/attempt_{attempt}"


def world_prefix(attempt: int) -> str:
    """The world store's prefix: the launch's keys with trial groups, for torchrun attempt ``attempt``."""
    return f"ds_optuna/world_{attempt}"


# --- launch store ----------------------------------------------------------------------------------------

#: The launch's group id (kept across torchrun restarts).
GROUP_ID = "ds_optuna/group_id"


def sweep_dir_key(run_id: str | None) -> str:
    """``ds_optuna/sweep_dir/<TORCHELASTIC_RUN_ID>`` (``none`` without one; ``None``: not under torchrun)."""
    return f"ds_optuna/sweep_dir/{run_id or 'none'}"


# --- attempt store ---------------------------------------------------------------------------------------

def arrival_key(what: str, trial: Any) -> str:
    """The arrival marks of one gather; each rank's mark is :func:`arrival_mark`."""
    return f"ds_optuna/arrived/{what}/{trial}"


def arrival_mark(key: str, rank: int) -> str:
    """``rank``'s mark under the gather's :func:`arrival_key`."""
    return f"{key}/{rank}"


def host_key(rank: int) -> str:
    """``rank``'s host, as :func:`._whoami.host_label` names it."""
    return f"ds_optuna/host/{rank}"


#: Why the launch ends, said once: ``{"rank", "status", "error", "trial", "ended"}`` (C41, C45).
LAUNCH_END = "ds_optuna/launch_end"

#: The study owner wrote the results: every other rank may leave (:mod:`._long_waits`).
RESULTS_WRITTEN = "ds_optuna/results_written"


def calls_namespace(trial: int, run: int) -> str:
    """The call check's keys of one task run: ``calls/<trial>.<run>``."""
    return f"calls/{trial}.{run}"


def call_at_key(namespace: str, rank: int) -> str:
    """Where ``rank`` is in the task run ``namespace``: ``<n>|<label>|<how it ended>``."""
    return f"{namespace}/at/{rank}"


def call_mark_key(namespace: str, n: int, label: str, rank: int) -> str:
    """``rank`` reached its ``n``-th trial call ``label`` in the task run ``namespace``."""
    return f"{namespace}/{n}/{label}/{rank}"


# --- world store (trial groups) --------------------------------------------------------------------------

#: Global rank 0's pickled ``Setup`` (or set-up error), read by every trial group's first rank.
SETUP = "setup"
#: The study service's request queue, and the prefix of each group's reply queue.
REQUEST_QUEUE, REPLY_QUEUE = "rpc/req", "rpc/rep"


def reply_queue(group: int) -> str:
    """Trial group ``group``'s reply queue."""
    return f"{REPLY_QUEUE}/{group}"

