"""Fault suite bookkeeping: every case records its outcome and, where it has one, a duration with what
that duration measures (by default "trial seconds": the faulty trial's start to its end as the study
stored them, which for a fault early in the trial is close to the time to detect it, and otherwise
includes the trial's own work), and a summary is printed at the end."""

import pytest

_ROWS: list[tuple[str, str, str]] = []


@pytest.fixture
def fault_record(request):
    """Call ``fault_record(detail, seconds, measured=...)`` from a fault test; the outcome is added afterwards.

    ``seconds`` (float, or ``None`` for none) is printed as ``(<measured> <seconds>)``; ``measured`` says
    what it is, ``"trial seconds"`` (the trial's ``datetime_complete - datetime_start``) unless given.
    """
    entry = {"detail": "", "seconds": None, "measured": "trial seconds"}

    def record(detail: str, seconds: float | None = None, *, measured: str = "trial seconds") -> None:
        entry.update(detail=detail, seconds=seconds, measured=measured)

    yield record
    rep = getattr(request.node, "rep_call", None)
    outcome = "passed" if rep is not None and rep.passed else "FAILED"
    secs = "" if entry["seconds"] is None else f" ({entry['measured']} {entry['seconds']:.1f})"
    _ROWS.append((request.node.name, outcome, f"{entry['detail']}{secs}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    terminalreporter.section("fault suite summary")
    width = max(len(r[0]) for r in _ROWS)
    for name, outcome, detail in _ROWS:
        terminalreporter.write_line(f"{name:<{width}}  {outcome:<7} {detail}")
