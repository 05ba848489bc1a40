"""A tiny Lightning model and a seeded fit for ``tests/test_lightning_unit.py``, in a module of its own so that
importing Lightning (seconds) is paid by the test worker that runs those tests, not by every worker's collection."""

import lightning.pytorch as pl
import torch


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def fit(tmp_path, model, **trainer_kwargs):
    """One seeded, deterministic fit, as a trial would run it; returns the Trainer (still referenced)."""
    pl.seed_everything(123, workers=True, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         deterministic=True, **{"max_epochs": 1, **trainer_kwargs})
    trainer.fit(model, loader(), loader())
    return trainer


class NeverRight(Tiny):
    """Logs ``val_acc`` = 0 at every validation: the worst value, so a median pruner prunes it."""

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", torch.tensor(0.0))
