"""The GPU's peak allocated memory of one trial, shared by both training glues.

With CUDA in use, the peak counter is reset when a trial scope starts and the peak is logged and stored
on the trial (rank 0 stores it as :data:`._stored.GPU_PEAK_ATTR`) when it ends; on CPU nothing happens.
Every GPU-peak function lives here, so the path the value takes to the study can change in one place.

Only the standard library is imported at module level; torch is read from ``sys.modules`` only when
something already imported it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Iterator

log = logging.getLogger(__name__)


def cuda_in_use() -> Any:
    """``torch.cuda`` when this process has initialised CUDA, else ``None`` (CPU runs: nothing to do)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@contextlib.contextmanager
def gpu_peak_of_trial() -> Iterator[None]:
    """With CUDA in use, reset the peak-memory counter on entry and record the trial's peak on exit
    (:func:`record_gpu_peak`); on CPU it does nothing."""
    cuda = cuda_in_use()
    if cuda is not None:
        cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        if cuda is not None:
            record_gpu_peak(cuda)


def record_gpu_peak(cuda: Any) -> None:
    """Log this rank's peak allocated GPU memory of the trial; rank 0 stores it as :data:`GPU_PEAK_ATTR`.

    No message between ranks: this runs on every exit path of a trial, also when peers are still busy.

    Args:
        cuda: the ``torch.cuda`` module (from :func:`cuda_in_use`); the peak is in bytes.
    """
    from .._study._stored import GPU_PEAK_ATTR
    from .._task._slot import current_trial, in_trial

    peak = int(cuda.max_memory_allocated())
    log.info("GPU peak allocated in this trial: %.1f MiB (device %d)", peak / 2**20, cuda.current_device())
    if in_trial():
        current_trial().record_on_rank0(GPU_PEAK_ATTR, peak)
