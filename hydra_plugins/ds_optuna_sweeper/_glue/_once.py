"""Each warning of the training libraries once per process, for the training glue (HF; Lightning too) (case C48).

What repeated in a user's own Trainer app (torch 2.13, transformers 5.24, accelerate 1.15, deepspeed 0.19.8;
ZeRO-3, gradient accumulation 2, 2 ranks, 3 trials; ``tests/multirank/test_library_noise.py``):

- **Python warnings.** torch's ``FutureWarning`` for ``all_gather_into_tensor`` and
  ``reduce_scatter_tensor`` (DeepSpeed's ZeRO-3 collectives, attributed to torch's ``c10d_logger.py``) came
  about 14 times per trial on each rank; in an 8-trial sweep they were 1,474 of 3,223 log lines. Python's
  default action shows a warning once per code location, but keeps that record in the raising module's
  ``__warningregistry__``, which is emptied whenever ``warnings.filters`` changes: every
  ``warnings.catch_warnings()`` does (the sweeper's around ``study.ask``, others inside training).
- **Logged warnings.** accelerate logs "Gradient accumulation steps mismatch: GradientAccumulationPlugin
  has 1, DeepSpeed config has 2. Using DeepSpeed's value." at every Trainer with accumulation above 1 (the
  Trainer leaves accumulation to DeepSpeed; harmless).

Each rank shows each text once: a rank's log is complete by itself. Warnings from other code, and warnings
turned into errors by a filter, are untouched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Any, Iterator

#: The libraries whose warnings repeat: top-level package names (their files) ...
LIBRARIES = ("transformers", "accelerate", "deepspeed", "torch", "huggingface_hub", "safetensors", "tokenizers")
#: ... and the roots of their logger names (DeepSpeed logs through one logger named "DeepSpeed").
LOGGER_ROOTS = (*LIBRARIES, "DeepSpeed")

#: (category name, text) of the library warnings already shown in this process.
_SHOWN_WARNINGS: set[tuple[str, str]] = set()


class OncePerText(logging.Filter):
    """A logging filter that lets each distinct message of ``min_level`` (a ``logging`` level number) or above
    through once; lower levels pass. One instance (:data:`ONCE`) is shared by every library logger, so a text
    logged by two loggers is shown once."""

    def __init__(self, min_level: int = logging.WARNING) -> None:
        super().__init__()
        self.min_level = min_level
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


#: The filter :func:`library_logs_once` puts on the library loggers.
ONCE = OncePerText()


def library_logs_once() -> None:
    """Put :data:`ONCE` on every logger of :data:`LOGGER_ROOTS` that exists now (idempotent).

    A logger's filters see only the records logged on that very logger, not those of its children, so
    each existing logger gets it; loggers created later get it at the next call.
    """
    names = list(logging.root.manager.loggerDict)
    for name in names:
        if name in LOGGER_ROOTS or name.startswith(tuple(f"{root}." for root in LOGGER_ROOTS)):
            logger = logging.getLogger(name)
            if ONCE not in logger.filters:
                logger.addFilter(ONCE)


def _library_dirs(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The package directories (with a trailing separator) of ``packages`` imported so far."""
    dirs = []
    for name in packages:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


@contextlib.contextmanager
def library_warnings_once(packages: tuple[str, ...] = LIBRARIES) -> Iterator[None]:
    """For the length of the block, show each warning raised from a file of ``packages`` (top-level package
    names, :data:`LIBRARIES` by default; the Lightning glue passes Lightning's) once per process.

    ``warnings.showwarning`` is wrapped (Python's ``"once"`` action keeps its record in the registry every
    filter change empties) and put back on exit. The key is the warning's category and text.
    """
    previous = warnings.showwarning

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if os.path.abspath(filename).startswith(_library_dirs(packages)):
            key = (getattr(category, "__name__", str(category)), str(message))
            if key in _SHOWN_WARNINGS:
                return
            _SHOWN_WARNINGS.add(key)
        previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = previous
