"""The task both tools tune in ``bench/vs_ray_tune.py``: ``examples/ddp_mlp.py``'s MLP on digits, as a generator.

``train(params, epochs, rank, world_size, timing_log)`` builds the model (``params``: ``lr`` float,
``n_layers`` int, ``n_units`` int, the width of every hidden layer), wraps it in DDP over the default
process group that the calling tool created, and yields ``(epoch, val_accuracy)`` after every epoch. The
caller reports the value to its tool (``trial.report`` / ``ray.train.report``) and either asks for the next
epoch or closes the generator (pruned, stopped).

Timing, the same for every tool: rank 0 appends one JSON line a epoch to ``timing_log`` (when given) with
``train_s`` (seconds of training and validation of that epoch) and ``report_s`` (seconds the caller spent
between receiving the value and asking for the next epoch: the tool's report, pruning check and anything it
does at that point). The line is written in a ``finally`` so an epoch whose report stops the trial counts too.

Schedulers that pause and continue (``ours_sched.py``, ``ray_sched.py``): ``resume`` is a :func:`state` dict to
start from (weights, optimizer state, epochs done; the learning rate is set to ``params["lr"]`` after the load, as
a PBT clone needs); :func:`state` of the generator's ``handles`` (filled with the model and optimizer) after a
yield is what to save. Without them, training is unchanged.
"""

import json
import sys
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

# The data, model and accuracy of examples/ddp_mlp.py (bench/vs_ray/ -> the repo's examples/).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from ddp_mlp import accuracy, make_data, make_model  # noqa: E402

SEED = 0
VAL_FRACTION = 0.3
BATCH_SIZE = 32  # micro batch per rank


def state(handles: dict, epochs_done: int) -> dict:
    """What a pause saves: weights, optimizer state (momentum) and epochs done (``handles`` from :func:`train`)."""
    return {"model": handles["model"].state_dict(), "opt": handles["opt"].state_dict(), "epoch": epochs_done}


def train(params: dict, epochs: int, rank: int, world_size: int, timing_log: str | None = None,
          resume: dict | None = None, handles: dict | None = None) -> Iterator[tuple[int, float]]:
    """Train ``epochs`` epochs; yield ``(epoch, val accuracy in [0, 1])`` after each (see the module doc)."""
    torch.manual_seed(SEED)  # same initial weights on every rank
    model = make_model([int(params["n_units"])] * int(params["n_layers"]))
    ddp = DistributedDataParallel(model) if dist.is_initialized() else model
    train_set, val = make_data(VAL_FRACTION, SEED)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(train_set, batch_size=BATCH_SIZE, sampler=sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=float(params["lr"]), momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    first = 0
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        for group in opt.param_groups:
            group["lr"] = float(params["lr"])  # the saved state holds the saving run's rate
        first = int(resume["epoch"])
    if handles is not None:
        handles.update(model=model, opt=opt)
    for epoch in range(first, epochs):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(ddp(xb), yb).backward()
            opt.step()
        acc = accuracy(model, val, rank, world_size)
        t1 = time.perf_counter()
        try:
            yield epoch, acc
        finally:
            if rank == 0 and timing_log:
                with open(timing_log, "a") as f:
                    f.write(json.dumps({"epoch": epoch, "train_s": t1 - t0,
                                        "report_s": time.perf_counter() - t1}) + "\n")
