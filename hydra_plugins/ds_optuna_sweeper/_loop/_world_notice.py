"""The one-time notice of a sweep started without torchrun (issue 38, C59).

A new user ran ``python app.py -m`` (torchrun forgotten): the sweep ran at world size 1 without a word, and each
trial was 7-10x slower than under torchrun, because torchrun sets ``OMP_NUM_THREADS=1`` for its ranks
(``torch.distributed.run``: when ``--nproc_per_node`` is above 1 and the variable is unset) while a plain
process lets torch use every core. Measured here (2 shared cores, load about 2, a 64-256-256-1 MLP, batch 64,
SGD): 14-16 ms a step with torch's 2 threads, 0.6-0.7 ms with 1. The sweeper does not change the thread
count itself: at world size 1 all of a machine's cores can be right (a large model on an idle many-core host),
and torchrun leaves it alone at one rank too. So the notice says it, with the number of threads torch uses.
"""

import os
import shlex
import sys


def started_by_torchrun() -> bool:
    """True inside a torchrun (torchelastic) worker: torchrun sets ``TORCHELASTIC_RUN_ID`` and ``WORLD_SIZE``."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


def world_size_one_notice(argv: list[str] | None = None) -> str | None:
    """The notice for a sweep outside torchrun, or None inside one.

    Args:
        argv: the command line (``sys.argv``), to write the torchrun command that runs the same sweep.

    Returns:
        One paragraph: the sweep runs at world size 1, the torchrun command for N ranks, and, when
        ``OMP_NUM_THREADS`` is unset and torch uses more than one thread, what torchrun would set.
    """
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
