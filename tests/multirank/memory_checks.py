"""The memory criteria of C14, shared by the DeepSpeed (``test_training_glue.py``) and Lightning
(``test_lightning.py``) tests; the series come from ``tests/apps/memory_probe.py``.

Why these and not "RSS after trial N within 5% of RSS after trial 1" (which failed 2 runs in 3 at +5.3% and
+6.0%): glibc keeps a varying amount of free memory inside its heap (fragmentation), which moves RSS in
steps of up to about 20 MiB (4%) on some runs and not on others, around a line with no slope. What a trial
leaves behind shows in glibc's bytes *in use*, and a leak shows as a slope of RSS.
"""

from __future__ import annotations


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (units of ``ys`` per trial).

    Raises:
        ZeroDivisionError: fewer than 2 values.
    """
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def assert_memory_flat(heap_in_use_mib: list[float], rss_mib: list[float], what: str,
                       heap_growth: float = 0.05, rss_slope: float = 0.02) -> None:
    """C14's two criteria on one process's series, one value per trial, in trial order (MiB), both from the
    second probe on (one warm-up trial, as :func:`assert_no_object_growth` is called with):

    - glibc's heap bytes in use after each trial at most ``heap_growth`` (fraction) above that at the second
      probe;
    - the least-squares slope of RSS from the second probe on at most ``rss_slope`` (fraction of RSS
      at the second probe) per trial.

    The heap criterion measured from the first probe failed every run of the Lightning sweep on a fresh
    install on 2026-12-03 (also at the commit that had passed CI): rank 0's heap in use went 189 -> 202 MiB
    between the first two probes, once, then 202.4 -> 202.8 over nine trials. A one-time allocation in
    the second trial is warm-up; a leak grows on every trial and still fails here.

    Args:
        heap_in_use_mib: ``heap_in_use_mib`` of each probe.
        rss_mib: ``rss_mib`` of each probe (at least 3 values).
        what: names the process in the failure message, e.g. ``"rank 1"``.

    Raises:
        AssertionError: either criterion fails; the message holds the series.
    """
    assert len(heap_in_use_mib) >= 3 and len(rss_mib) >= 3, f"{what}: too few probes ({heap_in_use_mib}, {rss_mib})"
    assert max(heap_in_use_mib[1:]) <= heap_in_use_mib[1] * (1 + heap_growth), \
        f"{what}: glibc heap in use per trial (MiB) {heap_in_use_mib}"
    assert slope(rss_mib[1:]) <= rss_slope * rss_mib[1], \
        f"{what}: RSS per trial (MiB) {rss_mib}, slope {slope(rss_mib[1:]):.1f} MiB per trial"


#: The live-object counts of ``memory_probe`` that must not grow once the first trials have run.
OBJECT_COUNTS = ("parameters", "tensors", "modules", "module_hooks", "engines", "trainers")


def assert_no_object_growth(series: dict[str, list[float]], warmup: int, what: str,
                            keys: tuple[str, ...] = OBJECT_COUNTS) -> None:
    """C14's object criterion: after trial ``warmup``, no count above its maximum over the first ``warmup``
    trials (lazy imports and first-use caches) at two probes in a row or at the last probe, for each of
    ``keys``.

    What a trial leaves behind is still there at every later probe, so it fails here. A count above the
    warm-up maximum at one probe that is gone by the next is no leak: a fresh install's Lightning sweep
    (2026-12-04) had 3 more live tensors on rank 1 after one pruned trial of twelve, and 1 again after the
    next trial, with RSS and the heap flat; the criterion "no probe above" failed on it.

    Args:
        series: ``{probe key: one value per trial, in trial order}`` (``memory_probe``'s keys).
        warmup: the number of warm-up trials (>= 1).
        what: names the process in the failure message.

    Raises:
        AssertionError: a count stayed above the warm-up maximum (something a trial built outlived it).
    """
    for key in keys:
        values = series[key]
        ceiling = max(values[:warmup])
        above = [v > ceiling for v in values[warmup:]]
        stayed = above[-1:] == [True] or any(a and b for a, b in zip(above, above[1:]))
        assert not stayed, f"{what}: live {key} per trial {values}"
