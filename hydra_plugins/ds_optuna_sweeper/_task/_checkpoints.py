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
modification time among equal or unknown steps (``last.ckpt``). Standard library only: every rank imports
this through :mod:`._handle`.
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


def checkpoints(directory: str) -> list[str]:
    """The complete checkpoints in ``directory`` (see the module docstring), oldest first; ``[]`` when the
    directory does not exist."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[int, float, str]] = []
    for entry in entries:
        if entry.is_dir() and _HF_DIR.match(entry.name):
            marker = os.path.join(entry.path, HF_COMPLETE_FILE)
            if not os.path.isfile(marker):
                continue  # cut short before the Trainer wrote its state: not resumable
            mtime = os.path.getmtime(marker)
        elif entry.is_file() and entry.name.endswith(".ckpt") and entry.stat().st_size > 0:
            mtime = entry.stat().st_mtime
        else:
            continue
        step = checkpoint_step(entry.path)
        found.append((step if step is not None else -1, mtime, entry.path))
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
    """The newest complete checkpoint in ``directory`` (absolute path), or ``None`` when there is none."""
    found = checkpoints(directory)
    return os.path.abspath(found[-1]) if found else None


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
