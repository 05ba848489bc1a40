"""Deliberately broken copies: does each cross-rank contract test catch a real bug in its contract? (issue 39)

The suite keeps one real torchrun launch per cross-rank contract; this checks that each of those launches fails
when its contract is broken. Each row of :data:`ROWS` is one semantic break (what a real bug would be, never a
changed log text): a product file under ``hydra_plugins/ds_optuna_sweeper/``, an exact text that occurs exactly
once in it, the text that replaces it, and the node id(s) of the contract test that must fail. For each row this
copies the committed tree (``git ls-files``, as ``bench/mutation.py``) into a scratch folder, applies the edit
(a row whose text is not found exactly once is refused), runs the node ids there with this interpreter
(``python -m pytest -q -p no:cacheprovider -x <ids>``, ``PYTHONPATH`` and cwd the copy) and records whether the
test failed (the break is caught: good) or passed (not caught: bad), with the seconds it took.

Usage (these start torchrun: on a shared machine run them under its lock)::

    python bench/contract_breaks.py                   # every row; 15-30 min on 2 cores
    python bench/contract_breaks.py --rows agreed-failure refusal-once
    python bench/contract_breaks.py --list

Writes ``bench/results/contract_breaks.md`` and ``.json`` (all rows only; ``--rows`` prints its table). Exits 1
when some break was not caught (or a row's test did not run), 2 when a row's edit does not apply.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402
from mutation import _copy_tree  # noqa: E402  (the committed tree, as the mutation run copies it)

ROOT = Path(__file__).resolve().parents[1]
PKG = "hydra_plugins/ds_optuna_sweeper"


@dataclass(frozen=True)
class Row:
    """One deliberate break: ``old`` (exactly once in ``path``) becomes ``new``; ``tests`` must then fail."""

    name: str
    contract: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


SWEEP = "tests/multirank/test_sweep.py::"
FAULTS = "tests/faults/"

ROWS: tuple[Row, ...] = (
    Row("same-config", "same config on every rank", f"{PKG}/_loop/_runner.py",
        "[list(p.overrides) + extra + self._rank_overrides for p in batch]",
        "[(list(p.overrides) if self.ctx.is_main else list(p.overrides)[:-1]) + extra + self._rank_overrides "
        "for p in batch]",
        (SWEEP + "test_c01_one_study_one_sampler_same_config_on_every_rank",),
        "ranks other than 0 compose their job config without the trial's last override"),
    Row("config-check", "config mismatch fails the trial", f"{PKG}/_loop/_config_check.py",
        "if len(set(prints)) != 1:",
        "if False and len(set(prints)) != 1:",
        (SWEEP + "test_config_mismatch_between_ranks_fails_the_trial_and_names_the_key",),
        "the fingerprint comparison is skipped: ranks run the task with different configs"),
    Row("prune-rank0-only", "prune at the same step", f"{PKG}/_task/_handle.py",
        'return bool(self._on_rank0("should_prune", lambda: self._trial.should_prune(), "should_prune()"))',
        'return bool(self._on_rank0("should_prune", lambda: self._trial.should_prune(), "should_prune()")) '
        "and self._ctx.is_main",
        (SWEEP + "test_c05_pruning_decided_on_rank0_stops_every_rank_at_the_same_step",),
        "should_prune() answers rank 0's verdict on rank 0 only; other ranks always hear False"),
    Row("suggest-inexact", "define-by-run values identical", f"{PKG}/_task/_handle.py",
        '        value = self._on_rank0(f"suggest {name}", fn, f"suggest_{kind}({name!r})")\n',
        '        value = self._on_rank0(f"suggest {name}", fn, f"suggest_{kind}({name!r})")\n'
        "        if not self._ctx.is_main and isinstance(value, float):\n"
        '            value = float(f"{value:.7g}")  # a float sent as short text: not the exact float64\n',
        (SWEEP + "test_define_by_run_values_are_identical_on_every_rank_and_stored",),
        "a suggested float reaches ranks other than 0 rounded to 7 significant digits"),
    Row("agreed-failure", "failure every rank agrees on", f"{PKG}/_loop/_agree.py",
        "bad = [(r, o) for r, o in enumerate(outcomes) if o.state in (Outcome.FAILED, Outcome.INTERRUPTED)]",
        "bad = [(r, o) for r, o in enumerate(outcomes[:1]) if o.state in (Outcome.FAILED, Outcome.INTERRUPTED)]",
        (FAULTS + "test_faults.py::test_a_failure_on_one_rank_is_agreed_by_every_rank_and_the_failure_rate_stop_"
         "ends_every_rank",),
        "the verdict reads rank 0's outcome only: a failure on rank 1 is told COMPLETE"),
    Row("no-grace-at-gather", "failure on one rank while its peer is blocked", f"{PKG}/_loop/_sweep.py",
        "grace_s=grace_s(failure) if failure is not None else None)",
        "grace_s=None)",
        (FAULTS + "test_peer_failure.py::test_c45_rank0_blocked_in_all_reduce_the_failing_rank_ends_the_launch_and_"
         "the_restart_resumes",),
        "the failing rank waits at the result gather for a peer blocked in all_reduce until rank_timeout"),
    Row("call-check-off", "skipped trial call", f"{PKG}/_comm/_arrivals.py",
        "if not ctx.distributed or ctx.store is None:",
        "if True:",
        (FAULTS + "test_skipped_calls_and_ctrl_c.py::test_c34_a_call_made_on_rank0_only_fails_the_trial_naming_"
         "rank_and_call",),
        "no call check: a call one rank skipped is not named before the broadcast"),
    Row("preempt-never", "SIGTERM and resume from a checkpoint", f"{PKG}/_task/_handle.py",
        "self.preempted = bool(flag or rung)",
        "self.preempted = bool(rung)",
        ("tests/multirank/test_preemption.py::test_sigterm_hf_deepspeed_trial_resumes_from_its_checkpoint[zero3]",),
        "should_preempt() never answers True: SIGTERM is noted but the task trains on, no checkpoint-and-stop"),
    Row("resume-ignored", "SIGTERM and resume from a checkpoint", f"{PKG}/_glue/_resume.py",
        "if trial is not None and trial.resume_from and argument not in kwargs and len(args) <= position:",
        "if False and trial is not None and trial.resume_from and argument not in kwargs and len(args) <= position:",
        ("tests/multirank/test_preemption.py::test_sigterm_hf_deepspeed_trial_resumes_from_its_checkpoint[zero3]",),
        "the retry's train() is not given the trial's checkpoint: it trains again from step 0"),
    Row("restart-new-dir", "kill -9 with --max-restarts", f"{PKG}/_loop/_sweep.py",
        "if attempt > 0 and store.check([key]):",
        "if False and attempt > 0 and store.check([key]):",
        (FAULTS + "test_faults.py::test_kill9_of_rank1_then_of_rank0_under_max_restarts_resumes_in_the_first_"
         "sweep_dir",),
        "a torchrun restart does not read back the first attempt's sweep dir: it composes a new one"),
    Row("refusal-every-rank", "a refusal: said once", f"{PKG}/_loop/_exits.py",
        "elif not owner and not package_error:",
        "elif not owner:",
        ("tests/multirank/test_setup_refusal.py::test_a_mapping_under_params_prints_its_message_once_and_exits_"
         "non_zero_without_a_traceback",),
        "every rank, not rank 0 alone, prints a set-up refusal"),
    Row("group-rank-global", "trial groups on 4 ranks", f"{PKG}/_loop/_trial_groups.py",
        'return {"RANK": str(group_rank), "WORLD_SIZE": str(size),',
        'return {"RANK": str(rank), "WORLD_SIZE": str(size),',
        ("tests/multirank/test_trial_groups.py::test_two_groups_of_two_ranks_agree_within_each_group",),
        "a trial group's RANK is the launch's global rank, not the rank within the group"),
    Row("ds-batch-no-ga", "HF + DeepSpeed main job", f"{PKG}/_glue/_hf_args.py",
        'total = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world_size()',
        'total = ds["train_micro_batch_size_per_gpu"] * world_size()',
        ("tests/multirank/test_training_glue.py::test_c02_engine_batch_settings_equal_the_trials_on_every_rank",),
        "the DeepSpeed section's train_batch_size leaves out the trial's gradient accumulation"),
    Row("lightning-prune-rank0", "Lightning", f"{PKG}/_glue/_lightning.py",
        "            if trial.should_prune():\n                self.pruned_at = at\n",
        "            if trial.should_prune() and trial.rank == 0:\n                self.pruned_at = at\n",
        ("tests/multirank/test_lightning.py::test_lightning_sweep_same_config_on_every_rank_prunes_alike_fails_"
         "alike_and_keeps_memory_flat",),
        "the Lightning pruning callback stops rank 0 alone on a prune verdict"),
    Row("owner-lock-free", "shared PostgreSQL study", f"{PKG}/_study/_owners.py",
        "                return not free\n",
        "                return False\n",
        ("tests/multirank/test_shared_study.py::test_two_groups_share_one_server_study[postgresql-shared_sweep_dir]",),
        "a PostgreSQL owner lock always reads as free: a live launch's running trials are closed as orphans"),
    Row("refit-no-params", "refit", f"{PKG}/_loop/_refit.py",
        "return TrialPayload(number, task_params, overrides, **fields)",
        "return TrialPayload(number, {}, overrides, **fields)",
        ("tests/multirank/test_refit.py::test_refit_at_two_ranks_replays_task_suggested_params_on_every_rank",),
        "the refit of a trial does not replay the params its task suggested"),
    Row("tracking-every-rank", "tracking", f"{PKG}/_tracking/_task_env.py",
        'if os.environ.get("RANK", "0") == "0":  # the trial\'s rank 0',
        "if True:  # the trial's rank 0",
        ("tests/multirank/test_tracking.py::test_two_rank_sweep_writes_one_run_per_trial_to_each_tracker_from_rank_"
         "0_only",),
        "every rank, not the trial's rank 0 alone, makes the trial's MLflow/W&B run active and logs to it"),
)


def apply(work: Path, row: Row) -> None:
    """Replace ``row.old`` by ``row.new`` in the copy. Raises ``SystemExit`` unless ``old`` occurs exactly once."""
    path = work / row.path
    text = path.read_text()
    found = text.count(row.old)
    if found != 1:
        raise SystemExit(f"row {row.name}: the old text occurs {found} times in {row.path} (must be exactly once)")
    path.write_text(text.replace(row.old, row.new))


def _summary(output: str) -> str:
    """pytest's last line (``1 failed in 12.3s``), without the time."""
    lines = [line.strip("= ").strip() for line in output.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last.rsplit(" in ", 1)[0] if " in " in last else last


_ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Interrupt)): (\S.*)")
_NOT_A_CAUSE = {"ChildFailedError", "AssertionError", "CalledProcessError"}


def how_it_failed(output: str) -> str:
    """What made the test fail, to show it failed on the break and not on something else: the test's first failed assertion, else the first error of this package a rank raised (``ConfigMismatchError: ...``), else the first
    other error named in the output."""
    ours = set(re.findall(r"^class (\w+)\(", (ROOT / PKG / "_errors.py").read_text(), re.M))
    lines = output.splitlines()
    errors = [(m[1], f"{m[1]}: {m[2]}") for m in map(_ERROR.search, lines) if m and m[1] not in _NOT_A_CAUSE]
    for line in lines:
        text = line[1:].strip() if line.startswith("E ") else ""
        if text.startswith(("assert ", "AssertionError: (", "AssertionError: [", "AssertionError: assert")):
            return text[:160]
    for name, text in errors:
        if name in ours:
            return text[:160]
    return errors[0][1][:160] if errors else ""


def _scrubbed(text: str) -> str:
    """``text`` without this machine's absolute paths (result files hold none: tests/test_bench_results.py)."""
    text = text.replace(str(ROOT), "<repo>").replace(sys.prefix, "<venv>")
    for prefix in ("/tmp/", "/home/", "/root/"):
        text = text.replace(prefix, "<" + prefix.strip("/") + ">/")
    return text


def run_row(row: Row) -> dict:
    """Break a copy of the tree as ``row`` says, run its tests there; the row's result (see :func:`main`)."""
    with tempfile.TemporaryDirectory(prefix=f"contract-break-{row.name}-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        apply(work, row)
        env = {**os.environ, "PYTHONPATH": str(work)}
        # The copy's package, not the editable install's, must be the one imported.
        where = subprocess.run([sys.executable, "-c", "import hydra_plugins.ds_optuna_sweeper as m; print(m.__file__)"],
                               cwd=work, env=env, capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(work)):
            raise SystemExit(f"row {row.name}: the copy imports the package from {where!r}, not from {work}")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *row.tests],
                                cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        output, _ = proc.communicate()
        seconds = time.monotonic() - t0
        try:  # a broken rank the test gave up on must not outlive the row
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output = output.replace(str(work), "<copy>")
    summary = _summary(output)
    if proc.returncode == 0 and "passed" in summary and "skipped" not in summary:
        verdict = "NOT caught"
    elif proc.returncode in (1, 2) and ("failed" in summary or "error" in summary):
        verdict = "caught"
    else:  # nothing ran, a skip, an interrupted or broken pytest run: the break was not shown to be caught
        verdict = "no verdict"
    return {**asdict(row), "rc": proc.returncode, "summary": summary, "verdict": verdict, "seconds": round(seconds, 1),
            "how": _scrubbed(how_it_failed(output)), "output_tail": _scrubbed(output[-4000:])}


def table(results: list[dict]) -> str:
    lines = ["| contract | break | test | caught? | how it failed | seconds |", "|---|---|---|---|---|---:|"]
    for r in results:
        tests = ", ".join("`" + t.split("::")[-1] + "`" for t in r["tests"])
        caught = {"caught": "yes", "NOT caught": "**NO**"}.get(r["verdict"], f"? ({r['summary']})")
        lines.append(f"| {r['contract']} | `{r['name']}`: {r['why']} (`{Path(r['path']).name}`) | {tests} | "
                     f"{caught} | {r.get('how', '').replace('|', '/')} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    names = [r.name for r in ROWS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=names, choices=names, metavar="ROW",
                        help="rows to run (default: all): " + ", ".join(names))
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if r.name in args.rows]
    if args.list:
        for r in rows:
            print(f"{r.name:22} {r.contract}: {r.why}\n{'':22} {r.path}; {' '.join(r.tests)}")
        return 0
    for r in rows:  # refuse a stale row before any test runs
        found = (ROOT / r.path).read_text().count(r.old)
        if found != 1:
            print(f"row {r.name}: the old text occurs {found} times in {r.path} (must be exactly once)", file=sys.stderr)
            return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    results = []
    for r in rows:
        print(f"breaking {r.name}: {r.why} ...", flush=True)
        results.append(run_row(r))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    text = table(results)
    bad = [r["name"] for r in results if r["verdict"] != "caught"]
    md = [text, "", f"Commit {commit}. Caught: the contract test failed on the broken copy (good). "
          f"{len(results) - len(bad)} of {len(results)} breaks caught"
          + (f"; not shown caught: {', '.join(bad)}." if bad else "."), ""]
    command = "python bench/contract_breaks.py" + ("" if rows == list(ROWS) else " --rows " + " ".join(args.rows))
    if rows == list(ROWS):
        save("contract_breaks", "\n".join(md), {"commit": commit, "results": results}, command)
    else:
        print("\n".join(md))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
