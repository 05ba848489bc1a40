"""Process patches of the Hugging Face glue: what :func:`~._hf_args.build_training_arguments` changes in
DeepSpeed and in ``os.environ`` so a trial can start under the sweeper (see ``_hf.py``, "Decisions").
Each is idempotent and does nothing when it is not needed. DeepSpeed and torch are imported inside functions only.
"""

from __future__ import annotations

import importlib
import os
import sys


def skip_deepspeed_shm_build() -> None:
    """Make DeepSpeed's CPU comm backend skip its JIT build of the ``deepspeed_shm_comm`` op.

    ``deepspeed.comm.torch.TorchBackend.__init__`` calls the module function ``build_shm_op()``, which returns
    :obj:`None` itself when the op is unavailable; we answer the same. ``import deepspeed.comm.torch as m``
    hands back the ``torch`` module (an attribute shadows the submodule), hence ``import_module``.
    """
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    if getattr(comm_torch.build_shm_op, "_dso_skipped", False):
        return

    def build_shm_op() -> None:
        return None

    build_shm_op._dso_skipped = True  # type: ignore[attr-defined]
    comm_torch.build_shm_op = build_shm_op


def init_deepspeed_comm() -> None:
    """Initialise ``deepspeed.comm`` on the process group accelerate created, if it is not yet.

    On CPU (``use_cpu=True``) accelerate creates the torch process group itself and leaves ``deepspeed.comm``
    uninitialised until the engine is built. ZeRO-3's partitioned init (``deepspeed.zero.Init`` inside
    ``from_pretrained``) runs before that, reads the world size from ``deepspeed.comm``, falls back to 1, and
    fails every rank with "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step *
    world_size 16 != 8 * 1 * 1" when the first trial of a process is a ZeRO-3 trial (seen with deepspeed
    0.19.8, transformers 5.24.0, accelerate 1.15.0, 2 ranks). With a group present DeepSpeed wraps it.
    """
    import deepspeed.comm as ds_comm
    import torch.distributed as dist

    if ds_comm.is_initialized() or not dist.is_initialized():
        return
    ds_comm.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False)


def single_process_env() -> None:
    """Give DeepSpeed a one-process world when the script was started without a launcher.

    DeepSpeed needs ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; without them it
    tries MPI discovery. Does nothing under torchrun (``WORLD_SIZE`` is set) or once a group exists.
    """
    dist = sys.modules.get("torch.distributed")
    if "WORLD_SIZE" in os.environ or (dist is not None and dist.is_initialized()):
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
