"""The GPU's peak allocated memory of one trial, shared by both training glues.

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
