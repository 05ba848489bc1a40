"""The one-time notice of a sweep started without torchrun (issue 38, C59).

``python app.py -m`` (torchrun forgotten) ran at world size 1 without a word, each trial 7-10x slower (2 busy
cores, a small MLP: 14-16 ms a step with torch's 2 threads, 0.6-0.7 ms with 1): torchrun sets
``OMP_NUM_THREADS=1`` for its ranks (``torch.distributed.run``, above one rank per node) while a plain process
uses every core. The sweeper leaves the thread count alone (every core can be right at world size 1) and says it.
"""

import os
import shlex
import sys


def started_by_torchrun() -> bool:
    """True inside a torchrun (torchelastic) worker: torchrun sets ``TORCHELASTIC_RUN_ID`` and ``WORLD_SIZE``."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


def world_size_one_notice(argv: list[str] | None = None) -> str | None:
    """The notice for a sweep outside torchrun (None inside one): the torchrun command for N ranks of ``argv``
    (default ``sys.argv``) and, when ``OMP_NUM_THREADS`` is unset and torch uses several threads, what torchrun sets."""
    if started_by_torchrun():
        return None
    argv = list(sys.argv if argv is None else argv)
    command = shlex.join(["torchrun", "--nproc_per_node", "N", *argv])
    text = (f"ds_optuna: this sweep runs at world size 1 (not started by torchrun): every trial runs in this one "
            f"process. To run each trial on N ranks: {command}")
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        threads = torch.get_num_threads()
        if threads > 1:
            text += (f". OMP_NUM_THREADS is not set, so torch uses {threads} threads here; torchrun sets "
                     "OMP_NUM_THREADS=1 for each of its ranks, and on a busy machine several threads per process "
                     "can make each training step many times slower: set OMP_NUM_THREADS to choose")
    return text
