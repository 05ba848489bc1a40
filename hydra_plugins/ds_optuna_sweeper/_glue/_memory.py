"""The process's memory between trials, shared by both training glues: glibc's knobs (a fixed mmap
threshold, ``malloc_trim``), the end-of-trial memory release, the trainer slot (the one ``Trainer`` a
trial scope holds until that release) and the GPU's peak allocated memory of one trial.

Only the standard library is imported at module level; torch is read from ``sys.modules`` only when
something already imported it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import sys
from typing import Any, Iterator

from .._errors import GlueUsageError

log = logging.getLogger(__name__)


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


def release_memory(trial_types: tuple[type, ...] = ()) -> None:
    """End-of-trial memory release: ``gc.collect()``, glibc's ``malloc_trim(0)`` (freed heap back to the OS),
    and with CUDA in use ``torch.cuda.empty_cache()``.

    After the first release that leaves no instance of ``trial_types`` alive, what survived it is frozen
    (``gc.freeze()``: moved to a permanent generation the cyclic collector no longer walks), so every later
    full collection walks only what later trials built. On the main job (2 CPU ranks, 6 trials, py-spy at
    40 Hz, issue 26) this release went from 0.56 s to 0.11 s a trial and rank, and accelerate's own
    ``gc.collect()`` at the start of each ``Trainer.train`` from 0.42 s to 0.08 s: about 0.8 s a trial, what
    the sweep cost over transformers' own search. Frozen objects are still freed by reference counting; only a
    cycle among them that turns to garbage later stays. While one of ``trial_types`` (what a leaking trial
    leaves) is alive nothing is frozen, so a leak stays visible to ``gc.get_objects()`` and the C14 checks.

    Args:
        trial_types: the types of what a trial builds and must not outlive it; ``()`` freezes unchecked.
    """
    global _FROZEN, _RELEASES
    _RELEASES += 1
    gc.collect()
    if not _FROZEN and not alive(trial_types):
        _FROZEN = True
        gc.freeze()
    libc = _glibc()
    if libc is not None:
        with contextlib.suppress(AttributeError):
            libc.malloc_trim(0)
    cuda = cuda_in_use()
    if cuda is not None:
        cuda.empty_cache()


def freeze_survivors_once(trial_types: tuple[type, ...]) -> None:
    """At the start of a trial: the freeze :func:`release_memory` could not do at the end of the first one.

    A task that keeps its trial's objects in local variables (``trainer = pl.Trainer(...)`` inside the
    ``with`` block of a trial scope) still holds them when the scope ends, so nothing was frozen, and every
    later full collection walks all of torch's and Lightning's objects again (about 610,000 on the Lightning
    example). When the next trial starts those locals are gone. It releases only right after the first
    end-of-trial release that froze nothing: once per process, never before a first trial has ended.

    Args:
        trial_types: as for :func:`release_memory`.
    """
    if _RELEASES == 1 and not _FROZEN:
        release_memory(trial_types)


def alive(types: tuple[type, ...]) -> int:
    """The number of objects tracked by the garbage collector whose type is one of ``types`` or a subclass.

    It reads each object's type only (``type(obj)``): ``isinstance`` asks a foreign object for its
    ``__class__``, and that ran torch's deprecated ``reduce_op.__getattribute__``, whose FutureWarning then came
    once per trial on each rank (C48). It walks every tracked object (tens of ms); call ``gc.collect()`` first
    to count only live ones. ``types=()`` counts nothing.
    """
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), types))


#: Whether :func:`release_memory` already froze the survivors of a first trial (once per process).
_FROZEN = False
#: How many times :func:`release_memory` ran in this process (:func:`freeze_survivors_once` reads it).
_RELEASES = 0

#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD`` (malloc.h).
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1024 * 1024


def fixed_mmap_threshold() -> None:
    """Keep large allocations out of the heap, once per process (glibc only; case C14).

    glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB on 64-bit),
    so after the first trial the tensor buffers of later trials come from the heap, where freed space
    is kept and fragments: RSS then stepped up at ZeRO-3 trials although nothing leaked (no live
    engine, parameter or hook after any trial; bytes in use flat; ``bench/memory.py``). Fixing the
    threshold (which also turns the dynamic adjustment off, mallopt(3)) kept RSS after 12 trials within
    2% of trial 1. It was glibc's initial 128 KiB until issue 26: every activation of the main job's
    micro batch (8 x 32 tokens x 384 floats, 393 KiB) was then mmapped and zero-filled afresh at each
    step, 6-7 s of system CPU more than transformers' own search over 6 trials on 2 ranks (20-25% of
    the training step's time in py-spy); at 1 MiB those come from the heap and the system time matches
    transformers' (35.6 s against 35.4-36.2 s, ``/usr/bin/time``). A user's own
    ``MALLOC_MMAP_THRESHOLD_`` wins.
    """
    global _MMAP_THRESHOLD_SET
    if _MMAP_THRESHOLD_SET or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    _MMAP_THRESHOLD_SET = True
    libc = _glibc()
    if libc is not None:
        with contextlib.suppress(AttributeError):
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


#: Whether :func:`fixed_mmap_threshold` already ran in this process.
_MMAP_THRESHOLD_SET = False


def _glibc() -> ctypes.CDLL | None:
    """glibc (``libc.so.6``) when this process runs on it, else ``None`` (musl, macOS, or it cannot be loaded)."""
    try:
        libc_version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        return None
    if not libc_version or not libc_version.startswith("glibc"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def cuda_in_use() -> Any:
    """``torch.cuda`` when this process has initialised CUDA, else ``None`` (CPU runs: nothing to do)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@contextlib.contextmanager
def gpu_peak_of_trial() -> Iterator[None]:
    """With CUDA in use, reset the peak-memory counter on entry, and on exit log this rank's peak allocated GPU
    memory of the trial; rank 0 stores it (in bytes) on the trial as :data:`._stored.GPU_PEAK_ATTR`. On CPU it
    does nothing. No message between ranks: this runs on every exit path of a trial, also when peers are still
    busy."""
    cuda = cuda_in_use()
    if cuda is not None:
        cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        if cuda is not None:
            from .._study._stored import GPU_PEAK_ATTR
            from .._task._slot import current_trial, in_trial

            peak = int(cuda.max_memory_allocated())
            log.info("GPU peak allocated in this trial: %.1f MiB (device %d)", peak / 2**20, cuda.current_device())
            if in_trial():
                current_trial().record_on_rank0(GPU_PEAK_ATTR, peak)
