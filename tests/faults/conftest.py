"""Fault suite bookkeeping: every case records its outcome and how long the failure took to be
detected (trial start to FAIL told, from the study), and a summary is printed at the end."""

import pytest

_ROWS: list[tuple[str, str, str]] = []


@pytest.fixture
def fault_record(request):
    """Call ``fault_record(detail, seconds)`` from a fault test; the outcome is added afterwards."""
    entry = {"detail": "", "seconds": None}

    def record(detail: str, seconds: float | None = None) -> None:
        entry["detail"], entry["seconds"] = detail, seconds

    yield record
    rep = getattr(request.node, "rep_call", None)
    outcome = "passed" if rep is not None and rep.passed else "FAILED"
    secs = "-" if entry["seconds"] is None else f"{entry['seconds']:.1f}"
    _ROWS.append((request.node.name, outcome, f"{entry['detail']} (detected in {secs} s)"))


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
