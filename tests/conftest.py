"""Shared fixtures and hooks.

- Restore the environment and the trial slot after every test.
- The process-lifetime rule for multi-process tests (``tests/torchrun_utils.py``): each test gets one
  deadline, its pytest timeout minus a margin, shared by every process it starts (module fixtures
  included, as they run inside the first test's timeout); whatever a test started and left running
  is killed when the test ends, however it ends.
"""

import os

import pytest

from tests import torchrun_utils


def deadline_margin_s(timeout_s: float) -> float:
    """Seconds kept between the processes' deadline and pytest's timeout: room to kill the processes,
    load the study and print the output tail. 10% of the timeout, within [10, 30]."""
    return max(10.0, min(30.0, 0.1 * timeout_s))


def timeout_of(item: pytest.Item) -> float | None:
    """The pytest-timeout seconds that apply to ``item`` (marker, ``--timeout``, ini), or ``None``."""
    try:
        import pytest_timeout

        timeout = pytest_timeout._get_item_settings(item).timeout  # marker > --timeout > env > ini
    except Exception:  # pytest-timeout missing or changed: read the marker and the ini ourselves
        marker = item.get_closest_marker("timeout")
        timeout = None
        if marker is not None:
            timeout = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if timeout is None:
            try:
                timeout = item.config.getini("timeout") or None
            except ValueError:
                timeout = None
    return float(timeout) if timeout else None


def _file_order(items: list[pytest.Item]) -> dict[str, tuple[int, float]]:
    """Sort key of each test file: the files that mostly wait come first, longest allowed first.

    ``make test`` runs the files on three workers (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``, which
    keeps this order): a file that starts real processes (``torchrun``) or waits out a storage outage
    (``postgres``) leaves its core idle much of the time, so starting those first lets the in-process tables fill
    the cores meanwhile, and the run does not end on one long file with the other worker idle. Within a kind,
    the file whose tests have the largest ``timeout`` marker (the closest thing to its expected length) first.
    """
    order: dict[str, tuple[int, float]] = {}
    for item in items:
        path = str(item.path)
        kind = 0 if item.get_closest_marker("torchrun") else 1 if item.get_closest_marker("postgres") else 2
        marker = item.get_closest_marker("timeout")
        allowed = float(marker.args[0]) if marker is not None and marker.args else 0.0
        old_kind, old_allowed = order.get(path, (2, 0.0))
        order[path] = (min(kind, old_kind), min(-allowed, old_allowed))
    return order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave ``soak`` tests out unless the ``-m`` expression names ``soak`` (``make soak`` does): they exist to
    shake out timing over many launches and would double the time of ``make test``. A test given by node id
    still runs when ``-m`` names soak; deselected ones are reported as such by pytest. Then order the files
    (:func:`_file_order`; the tests of a file keep their order)."""
    if "soak" not in (config.getoption("markexpr") or ""):
        kept, left = [], []
        for item in items:
            (left if item.get_closest_marker("soak") else kept).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    order = _file_order(items)
    items.sort(key=lambda item: order[str(item.path)])  # stable: a file's tests keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = timeout_of(item)
    if timeout:
        margin = deadline_margin_s(timeout)
        torchrun_utils.set_deadline(timeout - margin, f"pytest timeout {timeout:g} s - {margin:g} s margin")
    try:
        yield
    finally:
        torchrun_utils.set_deadline(None)
        torchrun_utils.kill_all_started()


@pytest.fixture(autouse=True)
def _restore_env_and_slot():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    from hydra_plugins.ds_optuna_sweeper._task._slot import _reset_for_tests

    _reset_for_tests()
