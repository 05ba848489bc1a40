"""Test app for the process-lifetime checks: each rank writes its pid to ``$DSO_RECORD_DIR/pid_rank<R>.txt``
and then sleeps ``argv[1]`` seconds (default 600), like a hung rank."""

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid_rank{os.environ.get('RANK', '0')}.txt").write_text(str(os.getpid()))
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
