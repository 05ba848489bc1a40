"""Run one of the examples as its own script, with each rank's exit status recorded (``tests/apps/exit_record.py``).

    torchrun --nproc-per-node 4 tests/apps/recorded_example.py examples/ddp_mlp.py -m hydra.sweeper.n_jobs=2 ...

The first argument is the example's path (relative to the repository root, or absolute); the rest are its own
arguments. The example runs unchanged (``runpy.run_path`` as ``__main__``, its folder first on ``sys.path`` as
for ``python examples/<name>.py``), inside :func:`exit_record.run_recorded`, so with ``DSO_EXIT_DIR`` set every
rank's observed exit status is written by global rank (the waiting parent's ``RANK``; a trial group's rewrite
happens in the child).
"""

import runpy
import sys
from pathlib import Path

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    script = Path(sys.argv.pop(1))
    script = script if script.is_absolute() else REPO / script
    sys.path.insert(0, str(script.parent))
    run_recorded(lambda: runpy.run_path(str(script), run_name="__main__"))
