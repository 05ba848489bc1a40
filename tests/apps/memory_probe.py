"""This process's memory and live training objects, for the tests' memory checks (C14).

:func:`memory_probe` is the one probe the test apps use: ``tests/apps/trial_loop.py`` (DeepSpeed trials)
calls it after each trial, ``tests/apps/lightning_fault_app.py`` (Lightning trials) at the start of each
trial. The criteria applied to its series are in ``tests/multirank/memory_checks.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from pathlib import Path
from typing import Any


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _mallinfo2() -> dict[str, float]:
    """glibc's heap counters (MiB): ``heap_in_use`` (uordblks + hblkhd) and ``heap_free`` (fordblks)."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = MallInfo2
    info = fn()
    return {"heap_in_use_mib": (info.uordblks + info.hblkhd) / 2**20, "heap_free_mib": info.fordblks / 2**20}


def _proc_status_mib() -> dict[str, float]:
    """``RssAnon``, ``RssFile`` and ``RssShmem`` of this process from ``/proc/self/status`` (MiB); {} elsewhere."""
    out = {}
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            out[f"{key[3:].lower()}_rss_mib"] = int(value.split()[0]) / 1024  # kB
    return out


def memory_probe() -> dict[str, Any]:
    """This process's memory and live training objects, after ``gc.collect()`` and glibc's ``malloc_trim(0)``.

    Returns:
        ``rss_mib`` (resident set, MiB) and its parts ``anon_rss_mib`` (anonymous: heap, tensors, Python
        objects), ``file_rss_mib`` (file-backed: shared libraries' code, mapped files) and
        ``shmem_rss_mib``, glibc heap counters (MiB), ``python_blocks``
        (``sys.getallocatedblocks()``), ``gc_objects`` (not counting frozen ones), ``gc_frozen``
        (``gc.get_freeze_count()``), ``threads``, ``fds``, and counts over ``gc.get_objects()``:
        ``engines`` (``DeepSpeedEngine`` instances), ``parameters`` (``torch.nn.Parameter``),
        ``parameter_mib`` (their storage), ``tensors`` (all tensors), ``modules`` (``torch.nn.Module``),
        ``module_hooks`` (forward/backward/pre hooks registered on live modules plus the global module
        hooks), and ``trainers`` (``transformers.Trainer``).
    """
    import psutil
    import torch

    gc.collect()
    _malloc_trim()
    engine_type = getattr(sys.modules.get("deepspeed.runtime.engine"), "DeepSpeedEngine", None)
    trainer_type = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    counts = {"engines": 0, "parameters": 0, "parameter_bytes": 0, "tensors": 0, "modules": 0,
              "module_hooks": 0, "trainers": 0}
    hook_attrs = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                  "_state_dict_hooks", "_load_state_dict_pre_hooks")
    for obj in gc.get_objects():
        kind = type(obj)
        if engine_type is not None and issubclass(kind, engine_type):
            counts["engines"] += 1
        if trainer_type is not None and issubclass(kind, trainer_type):
            counts["trainers"] += 1
        if issubclass(kind, torch.Tensor):
            counts["tensors"] += 1
            if issubclass(kind, torch.nn.Parameter):
                counts["parameters"] += 1
                with contextlib.suppress(Exception):
                    counts["parameter_bytes"] += obj.numel() * obj.element_size()
        elif issubclass(kind, torch.nn.Module):
            counts["modules"] += 1
            counts["module_hooks"] += sum(len(getattr(obj, a, None) or ()) for a in hook_attrs)
    module = torch.nn.modules.module
    counts["module_hooks"] += sum(len(getattr(module, name, None) or ()) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))
    counts["parameter_mib"] = counts.pop("parameter_bytes") / 2**20
    process = psutil.Process()
    return {
        "rss_mib": process.memory_info().rss / 2**20,
        **_proc_status_mib(),
        **_mallinfo2(),
        "python_blocks": sys.getallocatedblocks(),
        "gc_objects": len(gc.get_objects()),
        "gc_frozen": gc.get_freeze_count(),
        "threads": process.num_threads(),
        "fds": process.num_fds(),
        **counts,
    }
