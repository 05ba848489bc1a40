"""The study handle of each trial group's first rank, used by the loop in ``_sweep.py``: :class:`DirectStudy` on
rank 0 when the whole world is one trial group (the driver, called directly), :class:`LocalStudy` on global rank 0
with trial groups (in-process calls of its :class:`._study_service.StudyService`), and
:class:`._remote_study.RemoteStudy` on the first rank of every other trial group (requests through torchrun's store).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from typing import Any, Callable, Sequence, Union

from .._errors import RemoteError
from .._study import _owners
from .._study._override_text import command_line_overrides
from ._agree import Verdict
from ._driver import start_driver
from .._comm._launch_end import FINISHED
from .._comm._signals import SigtermGuard
from ._messages import WAIT, Command, Launch, Setup, TrialPayload
from ._refit import RefitQueue, RefitRuns
from ._remote_study import RemoteStudy, ask_wait_s
from ._study_service import StudyService

log = logging.getLogger(__name__)


class DirectStudy:
    """Rank 0's handle when the whole world is one trial group: each call goes straight to the
    :class:`._driver.Driver` (``None`` when rank 0's set-up failed)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._refit: RefitQueue | None = None

    @property
    def sweep_dir(self) -> str:
        return self.driver.sweep_dir if self.driver is not None else ""

    def setup_message(self, failure: RemoteError | None = None) -> Setup:
        """Rank 0's :class:`Setup`, or ``failure`` (rank 0's set-up error) for every rank."""
        return self.driver.setup_message() if failure is None and self.driver is not None else Setup(None, error=failure)

    def next_command(self) -> Command:
        return self.driver.next_command()

    def launch(self, payloads: Sequence[TrialPayload]) -> Launch:
        return self.driver.launch(payloads)

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        """Tell the verdicts of trials still open (a trial closed while it ran keeps the state it was closed with)."""
        self.driver.tell([v for v in verdicts if self.driver.is_open(v.number)])

    def abandon_open(self, why: str, *, retry: bool = True, everyone: bool = False, signalled: bool = False) -> None:
        """Close the open trials; ``everyone``/``signalled`` change nothing with one trial group."""
        if self.driver is not None:
            self.driver.abandon_open(why, retry=retry)

    def refit_next(self) -> Command:
        if self._refit is None:
            self._refit = RefitQueue(RefitRuns(self.driver))
        command = self._refit.next()
        assert command is not None, "with one trial group every refit run handed out is recorded before the next ask"
        return command

    def refit_record(self, payload: TrialPayload, verdict: Verdict) -> None:
        assert self._refit is not None
        self._refit.record(payload, verdict)

    def finish(self, why: str, *, wait: bool = True, wait_s: float | None = None) -> None:
        """Close a trial still open (``why``: this rank's leaving record), then write the results; nothing after a
        failed set-up. Never raises."""
        if self.driver is None:
            return
        try:
            self.driver.abandon_open(f"the sweep left with the trial open ({why})")
        except Exception:  # noqa: BLE001 - the results are still written; the trial stays for a later launch
            log.exception("rank 0 could not close the open trial")
        self.driver.finish()
        _owners.release_all()  # the lock file goes now: a script ending with exit_cleanly runs no atexit handler


class LocalStudy:
    """Global rank 0's own handle with trial groups (it runs trial group 0): in-process calls of the service."""

    def __init__(self, service: StudyService, group: int = 0) -> None:
        self.service = service
        self.group = group

    @property
    def driver(self) -> Any:
        return self.service.driver

    @property
    def sweep_dir(self) -> str:
        return self.driver.sweep_dir if self.driver is not None else ""

    def setup_message(self, failure: RemoteError | None = None) -> Setup:
        """Rank 0's :class:`Setup` (or ``failure``), also published to the other trial groups."""
        setup = self.driver.setup_message() if failure is None and self.driver is not None else Setup(None, error=failure)
        self.service.publish_setup(setup)
        if failure is None:
            self.service.start()
        return setup

    def next_command(self) -> Command:
        """The group's next round; :data:`._messages.WAIT` after :func:`ask_wait_s` while another group's trial may
        still pause and be continued (:meth:`._study_service.StudyService.next` answers ``None``)."""
        end = time.monotonic() + ask_wait_s(self.driver.settings.rank_timeout_s if self.driver else 1.0)

        def ready() -> Command | None:
            command = self.service.next(self.group)
            if command is not None:
                self.service.wake()  # other groups' deferred asks may be answerable now
            return command if command is not None or time.monotonic() < end else WAIT

        return self.service.wait(ready)

    def launch(self, payloads: Sequence[TrialPayload]) -> Launch:
        return self.driver.launch(payloads)

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        self.service.tell(self.group, verdicts)
        self.service.wake()  # a group whose ask waits for this trial's pause learns it

    def abandon_open(self, why: str, *, retry: bool = True, everyone: bool = False, signalled: bool = False) -> None:
        """Close this group's open trials; the launch then stops: every other group gets STOP at its next ask.
        ``everyone``: this process leaves now, so every group's open trial is closed too, as interrupted
        (re-queued with ``retry_failed_trials``). ``signalled`` is :class:`RemoteStudy`'s."""
        self.service.abandon(self.group, why, retry)
        self.service.stopping = self.service.stopping or why
        self.service.wake()  # asks held for other groups are answered: STOP
        if everyone:
            self.service.abandon(None, f"the launch stops: {why}", True)

    def refit_next(self) -> Command:
        def ready() -> Command | None:
            command = self.service.refit_next(self.group)
            self.service.wake()  # other groups' deferred requests may be answerable now
            return command

        return self.service.wait(ready)

    def refit_record(self, payload: TrialPayload, verdict: Verdict) -> None:
        self.service.refit_record(self.group, payload, verdict)
        self.service.wake()

    def finish(self, why: str, *, wait: bool = True, wait_s: float | None = None) -> None:
        """Wait until every other group left, then write the results and let every rank leave (a signal while
        waiting closes what is still open first). ``wait=False`` (this rank was interrupted): close every group's
        open trials and write the results now. ``wait_s`` (after an agreed preemption): wait at most that many
        seconds, then close what is still open, before torchrun's SIGKILL (30 s after its SIGTERM)."""
        service = self.service
        try:
            service.done(self.group, why)
            service.wake()
            if not wait:
                service.stopping = service.stopping or why
                service.abandon(None, f"the launch stops: {why}", True)
            elif self.driver is not None and wait_s is not None:
                end = time.monotonic() + wait_s
                service.wait(lambda: service.all_done() or (False if time.monotonic() >= end else None))
                if not service.all_done():
                    service.stopping = service.stopping or why
                    service.abandon(None, f"the launch stops: {why}; a trial group did not stop within "
                                          f"{wait_s:g} s", True)
            elif self.driver is not None:  # a set-up that failed reached every group, none will say done
                # the sweep's guard is gone: torchrun's SIGTERM here raises, so the results are still written
                with SigtermGuard(sigterm=True):
                    service.wait(service.all_done)
                log.info(_groups_summary(service.done_reasons()))
        except BaseException:
            service.stopping = service.stopping or "rank 0 was interrupted"
            with contextlib.suppress(Exception):
                service.abandon(None, "rank 0 stops the launch", True)
            raise
        finally:
            if self.driver is not None:
                self.driver.finish()
                _owners.release_all()  # as in LocalStudy.finish
            service.mark_results_written()
            service.stop()


#: The study handle of a world's first rank (the loop's ``study``).
StudyHandle = Union[DirectStudy, LocalStudy, RemoteStudy]


def open_handle(settings: Any, config: Any, hydra_context: Any, ctx: Any, groups: Any,
                arguments: Sequence[str]) -> tuple[StudyHandle, Exception | None]:
    """This world's first rank: its handle on the study, and rank 0's set-up error (kept, not raised) to share
    with every rank. ``groups``: this process's :class:`._trial_groups.TrialGroups`, or ``None``."""
    if groups is not None and not groups.is_owner:
        return RemoteStudy(groups.world_store, groups.index, settings.rank_timeout_s,
                           pauses=settings.scheduler.pauses), None
    driver, failure = None, None
    try:
        driver = start_driver(settings, config, arguments, _group_options(hydra_context, config),
                              group_id=ctx.group_id, restarted=ctx.restarted)
    except Exception as e:
        log.error("Sweep set-up failed on rank 0: %s: %s", type(e).__name__, e)
        failure = e
    if groups is None:
        return DirectStudy(driver), failure
    return LocalStudy(StudyService(driver, groups.n_groups, groups.world_store)), failure


def _group_options(hydra_context: Any, config: Any) -> Callable[..., list[str]] | None:
    """``group -> [options]`` (``groups=True``: the config groups below ``group``) from Hydra's config repository,
    with this app's primary config and search path; ``None`` without a config loader."""
    from hydra.core.object_type import ObjectType

    loader = getattr(hydra_context, "config_loader", None)
    if loader is None or config is None:
        return None
    config_name = config.hydra.job.get("config_name")
    hydra_overrides = command_line_overrides(config)

    def group_options(group: str, groups: bool = False) -> list[str]:
        kind = ObjectType.GROUP if groups else ObjectType.CONFIG
        return loader.get_group_options(group, results_filter=kind, config_name=config_name,
                                        overrides=hydra_overrides)

    return group_options


#: Where a stop's reason starts giving the resume command (printed in full where the stop happened).
_RESUME_TAIL = re.compile(r"[;.]?\s*(?:the study keeps every trial\b.*)?(?:fix the cause and )?resume (?:the study )?with\b",
                          re.IGNORECASE)


def _groups_summary(reasons: dict[int, str]) -> str:
    """Rank 0's one line once every trial group left: ``"Sweep finished: ..."`` when each finished its search, else
    ``"Sweep ended: every trial group has stopped (group 0: ...; group 1: ...)"``, each reason cut to its first
    line (the full message was logged where it happened)."""
    short = {g: _RESUME_TAIL.split((why.strip().splitlines() or [""])[0])[0].rstrip(".;: ")
             for g, why in sorted(reasons.items())}
    if all(why == FINISHED for why in short.values()):
        return f"Sweep finished: every trial group is done ({len(short)} groups)"
    return "Sweep ended: every trial group has stopped (" + "; ".join(f"group {g}: {w}" for g, w in short.items()) + ")"
