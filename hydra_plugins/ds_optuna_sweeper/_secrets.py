"""Storage passwords out of every text and file the sweeper writes or makes Hydra write.

One rule, :func:`redact`: ``scheme://user:password@`` becomes ``scheme://user:***@``. Hydra's ``run_job`` writes
the job's whole config into ``.hydra/hydra.yaml`` (``hydra.sweeper.storage`` and the override that set it) before
the task starts (issue 38, C59): :func:`redact_job_files` rewrites those files at the start of the task wrapper.
Only the standard library (and Hydra's ``HydraConfig``, imported when called).
"""

from __future__ import annotations

import re
from pathlib import Path

#: ``scheme://user:password@`` in any text (a storage URL in a rerun line, an error message, a YAML file).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+@")

#: The files Hydra's ``run_job`` writes into ``<job dir>/<hydra.output_subdir>`` (``hydra/core/utils.py``).
HYDRA_JOB_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def redact(text: str) -> str:
    """``text`` with every URL password replaced by ``***`` (``postgresql://u:***@host/db``)."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def redact_file(path: Path) -> bool:
    """Rewrite ``path`` with :func:`redact` applied; True when the file held a password and was rewritten, False
    otherwise (also for a file that is missing or cannot be read or written: the caller's job goes on)."""
    try:
        text = path.read_text(encoding="utf-8")
        hidden = redact(text)
        if hidden == text:
            return False
        path.write_text(hidden, encoding="utf-8")
        return True
    except (OSError, UnicodeError):
        return False


def redact_job_files() -> list[Path]:
    """Inside a Hydra job: :func:`redact_file` on the ``.hydra`` files Hydra wrote for it (none with
    ``hydra.output_subdir=null``, as on the ranks other than the job's rank 0); returns those rewritten."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    if hc.output_subdir is None:
        return []
    folder = Path(hc.runtime.output_dir) / str(hc.output_subdir)
    return [folder / name for name in HYDRA_JOB_FILES if redact_file(folder / name)]
