"""A trial's checkpoints on disk: which one a retried trial resumes from, and which ones are kept.

Each trial gets one checkpoint directory (``trial.checkpoint_dir``) that outlives its attempts: a retry of
the trial (after SIGTERM, a crash, ``kill -9``) gets the same directory, so it finds what the attempt it
replaces saved. What counts as a checkpoint there, as the libraries write them:

- a ``checkpoint-<step>`` **directory**, as the Hugging Face ``Trainer`` writes them (with DeepSpeed, the
  ZeRO shards sit inside it under ``global_step<step>/``). It is complete once ``trainer_state.json`` is in
  it: the Trainer writes that file after the model, optimizer, scheduler and DeepSpeed state
  (``Trainer._save_checkpoint``, checked in transformers 5.24), so a directory cut short by SIGKILL has none
  and is skipped;
- a ``*.ckpt`` **file**, as Lightning's ``ModelCheckpoint`` and ``Trainer.save_checkpoint`` write them
  (``epoch=0-step=40.ckpt``, ``last.ckpt``), or as the plain DDP example writes ``step=<step>.ckpt``
  through a temporary name and ``os.replace`` (a ``*.ckpt.tmp`` left by SIGKILL is not a checkpoint).

The newest is the one with the highest step (``checkpoint-<step>``, ``step=<step>``), the newest
modification time among equal or unknown steps (``last.ckpt``). Standard library only: rank 0 imports it for each
asked trial (:mod:`.._study._trial_checkpoints`) and every rank for a refit (:mod:`.._loop._refit`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Iterable, Optional

log = logging.getLogger(__name__)

#: The file the Hugging Face Trainer writes last into a ``checkpoint-<step>`` directory.
HF_COMPLETE_FILE = "trainer_state.json"
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_STEP = re.compile(r"(?:^|[-_])step[=_-]?(\d+)")


def checkpoint_step(path: str) -> Optional[int]:
    """The training step a checkpoint's name gives (``checkpoint-40`` -> 40, ``epoch=0-step=40.ckpt`` -> 40),
    or ``None`` (``last.ckpt``)."""
    name = os.path.basename(os.path.normpath(path))
    match = _HF_DIR.match(name) or _STEP.search(name)
    return int(match.group(1)) if match else None


def _scan(directory: str) -> tuple[list[tuple[int, float, str]], list[tuple[str, str]]]:
    """The entries of ``directory`` named like a checkpoint (see the module docstring): the complete ones as
    ``(step or -1, mtime, path)``, and the skipped ones (a ``checkpoint-<step>`` directory without
    ``trainer_state.json``, an empty ``*.ckpt`` file) as ``(path, what the convention needs)``, sorted."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    found: list[tuple[int, float, str]] = []
    skipped = []
    for entry in entries:
        if entry.is_dir() and _HF_DIR.match(entry.name):
            marker = os.path.join(entry.path, HF_COMPLETE_FILE)
            if not os.path.isfile(marker):  # cut short before the Trainer wrote its state: not resumable
                needs = (f"a checkpoint-<step> directory counts once {HF_COMPLETE_FILE} is in it (the HF Trainer "
                         "writes it last; a directory cut short by SIGKILL has none)")
                skipped.append((entry.path, needs))
                continue
            mtime = os.path.getmtime(marker)
        elif entry.is_file() and entry.name.endswith(".ckpt"):
            if entry.stat().st_size == 0:
                skipped.append((entry.path, "a *.ckpt file counts once it is not empty"))
                continue
            mtime = entry.stat().st_mtime
        else:
            continue
        step = checkpoint_step(entry.path)
        found.append((step if step is not None else -1, mtime, entry.path))
    return found, sorted(skipped)


def checkpoints(directory: str) -> list[str]:
    """The complete checkpoints in ``directory`` (see the module docstring), oldest first; ``[]`` when the
    directory does not exist."""
    found = _scan(directory)[0]
    # By step, then time; a file without a step (last.ckpt) sorts by time among the ones of its step (-1) and
    # wins when it is newer than every stepped one.
    stepped = sorted(f for f in found if f[0] >= 0)
    unstepped = sorted((f for f in found if f[0] < 0), key=lambda f: f[1])
    ordered = [f[2] for f in stepped]
    for _, mtime, path in unstepped:
        newer = not stepped or mtime >= max(f[1] for f in stepped)
        ordered.append(path) if newer else ordered.insert(0, path)
    return ordered


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest complete checkpoint in ``directory`` (absolute path), or ``None`` when there is none.

    Logs a warning naming each skipped entry whose step is above the chosen checkpoint's (or any, when none is
    chosen), with what the convention needs: the retry would otherwise start before it silently (issue 38,
    C58: ``checkpoint-<step>/model.pt`` of a task's own layout resumed from step 0).
    """
    found = checkpoints(directory)
    chosen = os.path.abspath(found[-1]) if found else None
    floor = checkpoint_step(chosen) if chosen else None
    for path, needs in _scan(directory)[1]:
        step = checkpoint_step(path)
        if chosen is None or (step is not None and (floor is None or step > floor)):
            log.warning("checkpoint %s was skipped (%s, %s; or save a *.ckpt file): the trial resumes from %s",
                        path, "not a complete checkpoint", needs, chosen or "the start")
    return chosen


def remove(path: str) -> bool:
    """Delete a checkpoint file or directory tree; ``False`` when it was not there or could not be deleted
    (logged: a checkpoint left behind costs disk, never the sweep)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("could not delete checkpoint %s: %s", path, e)
        return False


def keep_latest(directory: str, keep: int = 1) -> list[str]:
    """Delete all but the ``keep`` newest complete checkpoints in ``directory``; return the deleted paths."""
    found = checkpoints(directory)
    doomed = found[: max(len(found) - keep, 0)]
    return [p for p in doomed if remove(p)]


def remove_dirs(directories: Iterable[str]) -> list[str]:
    """Delete whole trial checkpoint directories; return those deleted."""
    return [d for d in directories if d and os.path.isdir(d) and remove(d)]


def size_bytes(directory: str) -> int:
    """Bytes of the files under ``directory`` (their apparent sizes, links not followed); 0 when it is gone."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed meanwhile
    return total
