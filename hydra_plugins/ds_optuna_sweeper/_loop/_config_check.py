"""Every rank: the config check, one collective per job, before the user's task runs.

A config that resolves differently on one rank would train different models under one trial, so before the task
runs the ranks compare a fingerprint of the resolved config (docs/design.md, "One config"). A rank whose job failed
before the task wrapper ran still answers the same collective after the launch, with its failure.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from .._errors import ConfigMismatchError, DSOptunaSweeperError
from ._agree import config_fingerprint, differing_keys, flatten
from .._comm._ranks import RankComm
from ._timings import PhaseTimer


class ConfigCheck:
    """The config-check collective of one rank (``timer``: its ``config_check`` phase)."""

    def __init__(self, ctx: RankComm, timer: PhaseTimer) -> None:
        self.ctx = ctx
        self.timer = timer
        self._met: set[int] = set()  # trials whose check ran inside the job, until the launch's closing call

    def meet(self, number: int, cfg: DictConfig | None, failure: str = "") -> None:
        """Take part in trial ``number``'s config check, once per launch of its job; nothing at world size 1.
        Called inside the job with the composed ``cfg``, then after the launch with ``cfg=None``: that closing
        call answers the collective with ``failure`` (why the job ended) when the job never reached the wrapper.

        Raises:
            ConfigMismatchError: if any rank's resolved config differs from rank 0's; lists the keys.
            DSOptunaSweeperError: if the config could not be resolved on some rank.
        """
        if not self.ctx.distributed:
            return
        if cfg is None:
            if number in self._met:
                self._met.discard(number)
            else:
                self.ctx.gather_errors(f"the job failed before its task ran: {failure}",
                                       what="config fingerprint", trial=number)
            return
        self._met.add(number)
        with self.timer.phase("config_check"):
            fingerprint, error = None, None
            try:
                fingerprint = config_fingerprint(cfg)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            errors, prints = self.ctx.gather_errors(error, what="config fingerprint", trial=number, value=fingerprint)
            if errors:
                raise DSOptunaSweeperError(
                    f"trial {number}: the task config could not be resolved on "
                    + "; ".join(f"rank {r}: {err}" for r, err in errors)
                )
            if len(set(prints)) != 1:
                self._mismatch(cfg, number, prints)

    def _mismatch(self, cfg: DictConfig, number: int, prints: list[Any]) -> None:
        """Gather the flattened configs and raise :class:`ConfigMismatchError` naming the differing keys."""
        flat = flatten(OmegaConf.to_container(cfg, resolve=True))
        flats = self.ctx.all_gather(flat, what="config for comparison", trial=number)
        keys = differing_keys(flats)
        ranks = [r for r, h in enumerate(prints) if h != prints[0]]
        detail = ", ".join(
            f"{k}: rank 0 {flats[0].get(k, '<missing>')!r} vs rank {ranks[0]} {flats[ranks[0]].get(k, '<missing>')!r}"
            for k in keys[:5]
        )
        raise ConfigMismatchError(
            f"trial {number}: resolved config differs between rank 0 and rank(s) {ranks} at {keys} ({detail}). "
            "Every rank must compose the same config; per-rank values (local rank, device, environment "
            "variables) must not be part of the composed config."
        )
