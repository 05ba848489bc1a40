"""The plain training script both tools start from: one run of the digits MLP with fixed hyperparameters.

    torchrun --nproc-per-node 2 bench/vs_ray/plain.py --lr 0.01 --n-layers 2 --n-units 64

``bench/vs_ray_tune.py`` counts the lines each tool's script (``ours.py`` + ``conf/ours.yaml``,
``ray_tune.py``) changes from this one.
"""

import argparse
import os

import torch.distributed as dist

from digits import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-units", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=12)
    args = ap.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    params = {"lr": args.lr, "n_layers": args.n_layers, "n_units": args.n_units}
    acc = 0.0
    for epoch, acc in train(params, args.epochs, rank, world_size):
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {acc:.4f}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
