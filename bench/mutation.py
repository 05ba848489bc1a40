"""Mutation testing of the pure modules with mutmut: do the rule tables kill mutants? (issue 39, item 4)

For each pure module (the agreement rules, the search space and override text, the settings checks, the stop
rules, the rerun/resume command text, the results) this copies the committed tree (``git ls-files``) into a
scratch folder, has ``mutmut run`` mutate that one module and run only the in-process test files that cover it,
and prints a table: mutants, killed (a test failed, or the tests ran past mutmut's timeout), survived, no test
reached the mutant, and the share killed. Every survivor is listed with its diff in the result file, where it is
either killed by a new table row or explained (an equivalent mutant: same behaviour, e.g. a log text).

Usage::

    pip install -e '.[mutation]'          # mutmut (make mutation does both)
    python bench/mutation.py                     # every module below; about 30-60 min on 2 cores
    python bench/mutation.py --modules _stop _command --jobs 2
    python bench/mutation.py --modules _agree --merge   # replace _agree's row, keep the others'
    python bench/mutation.py --modules _results --merge --out /tmp/b/mutation   # side by side with another run ...
    python bench/mutation.py --modules --merge --merge-from /tmp/b/mutation.json  # ... then combined here

Each module's row names the commit it ran at (``+dirty``: uncommitted edits were copied). The result file lists
every survivor's diff, then which are explained (``EXPLAINED``: equivalent mutants), which a row added after the
module's run kills (``KILLED_AFTER``), and any left neither killed nor explained.

Writes ``bench/results/mutation.md`` (the table and the survivors' diffs) and ``mutation.json``. Target: 90%
killed per module (issue 39).

Raises ``SystemExit`` when mutmut is not installed or a module's baseline test run fails (mutmut's "stats" run
needs the selected tests green on the unmutated code).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PKG = "hydra_plugins/ds_optuna_sweeper"

# module (short name) -> (path, the in-process test files that test it). Tests that start torchrun are left out:
# mutmut runs the selection once per mutant.
MODULES: dict[str, tuple[str, list[str]]] = {
    "_agree": (f"{PKG}/_loop/_agree.py", ["tests/test_agreement.py"]),
    "_search_space": (f"{PKG}/_study/_search_space.py", ["tests/test_search_space.py", "tests/test_input_refusals.py"]),
    "_space_checks": (f"{PKG}/_study/_space_checks.py", ["tests/test_input_refusals.py", "tests/test_search_space.py",
                                                      "tests/test_space_checks.py"]),
    "_override_text": (f"{PKG}/_study/_override_text.py", ["tests/test_search_space.py", "tests/test_override_text.py"]),
    "_distributions": (f"{PKG}/_study/_distributions.py", ["tests/test_search_space.py", "tests/test_stored_study.py",
                                                      "tests/test_distributions.py"]),
    "_settings": (f"{PKG}/_settings.py", ["tests/test_config_errors.py", "tests/test_settings.py"]),
    "_setting_values": (f"{PKG}/_setting_values.py", ["tests/test_config_errors.py", "tests/test_input_refusals.py",
                                                    "tests/test_setting_values.py"]),
    "_stop": (f"{PKG}/_study/_stop.py", ["tests/test_stop_rules.py"]),
    "_command": (f"{PKG}/_study/_command.py", ["tests/test_command.py"]),
    "_results": (f"{PKG}/_study/_results.py", ["tests/test_stored_study.py", "tests/test_gpu_helpers.py",
                                                "tests/test_results.py"]),
}

# Survivors read and judged equivalent (same behaviour a test could observe), keyed by mutmut's mutant name
# without the module prefix. Each is listed under "Explained" in the result file.
EXPLAINED: dict[str, str] = {
    "x__build_terminator__mutmut_2": "simplefilter('ignore', None) ignores every warning in that block, a superset "
                                     "of FutureWarning; nothing else warns while importing optuna.terminator",
    "x__build_terminator__mutmut_4": "simplefilter('ignore') ignores every warning in the import block (as _2)",
    "x__build_terminator__mutmut_10": "simplefilter('ignore') ignores every warning while building (as _2)",
    "x__build_terminator__mutmut_16": "simplefilter('ignore') ignores every warning while building (as _2)",
    "x__finished_since__mutmut_11": ">= differs from > only at an equal (datetime_complete, number) pair, which is "
                                    "the best trial itself, already excluded by t.number != best.number",
    "xǁStopCheckǁ_should_terminate__mutmut_6": "only the log text's last field; the first line of the error text "
                                               "is not asserted (Optuna's errors are one line)",
    "xǁStopCheckǁ_should_terminate__mutmut_25": "split(None) splits on any whitespace; same text's first word only "
                                                "in the log, behaviour unchanged",
    "xǁStopCheckǁ_should_terminate__mutmut_26": "only the log text's last field (str(None))",
    "xǁStopCheckǁ_should_terminate__mutmut_27": "Optuna's one-line error text holds no newline: same log text",
    "xǁStopCheckǁreason__mutmut_3": "deepcopy=None is falsy: the same call as deepcopy=False",
    "xǁStopCheckǁreason__mutmut_5": "deepcopy=True (the default) copies the trials: slower, the same values",
    "xǁStopCheckǁreason__mutmut_8": "deepcopy=True copies the trials: slower, the same values",
    # _distributions
    "x__range_param__mutmut_106": "a log-scaled int range has step 1 or -1 here (other steps are refused above), "
                                  "and abs(step) is then 1, the same step",
    # _results
    "x_summary_table__mutmut_3": "deepcopy=None is falsy: the same call as deepcopy=False",
    "x_summary_table__mutmut_5": "deepcopy=True copies the trials the table only reads: slower, the same table",
    "x_summarize__mutmut_2": "deepcopy=None is falsy: the same call as deepcopy=False",
    "x_summarize__mutmut_4": "deepcopy=True copies the trials summarize only reads: slower, the same summary",
    "x_trials_rows__mutmut_2": "deepcopy=None is falsy: the same call as deepcopy=False",
    "x_trials_rows__mutmut_4": "deepcopy=True copies the trials the rows only read: slower, the same rows",
    "x_write_results__mutmut_32": "sort_keys=None is falsy: the same dump as sort_keys=False",
    "x_write_results__mutmut_38": "a width of 2**31 + 1 instead of 2**31 - 1: no line is that long, nothing folds",
    "x_write_results__mutmut_40": "a width of 3**31 - 1: no line is that long, nothing folds",
    "x_write_results__mutmut_41": "a width of 2**32 - 1: no line is that long, nothing folds",
    "x_write_results__mutmut_42": "a width of 2**31 - 2: no line is that long, nothing folds",
    "x_write_trials_csv__mutmut_46": "codec names are case-insensitive: 'UTF-8' is 'utf-8'",
    # _setting_values
    "x_check_heartbeat__mutmut_42": "only the source line the warning is reported at (stacklevel); under mutmut the "
                                    "caller's frame is mutmut's trampoline in the same file, so a row asserting the "
                                    "caller's file fails mutmut's own baseline run: not measurable here",
    "x_check_heartbeat__mutmut_48": "as _42: stacklevel 3 instead of 2, only where the warning is reported",
    "x_check_budget__mutmut_7": "n_jobs >= 1: plan_groups(1, ...) is one group of the whole world, never refused",
    "x_check_heartbeat__mutmut_38": "warnings.warn(..., None) warns a UserWarning, the default category",
    "x_check_heartbeat__mutmut_41": "warnings.warn without a category warns a UserWarning, the default",
    "x_check_storage_retry__mutmut_7": "-2.0 and -1.0 are both below 0 and only mark null; the message shows the "
                                       "key's own value",
    # _space_checks
    "x_check_group_options__mutmut_6": "split('@') and split('@', 1) have the same first element",
    "x_check_group_options__mutmut_7": "rsplit differs from split only for a key with two '@', which Hydra's "
                                       "override grammar refuses (key: group[@package])",
    "x_check_group_options__mutmut_12": "split('@', 2) and split('@', 1) have the same first element",
    "x_check_baseline_keys__mutmut_11": "split('=') and split('=', 1) have the same first element",
    "x_check_baseline_keys__mutmut_14": "split('=', 2) and split('=', 1) have the same first element",
    "x__group_path_problem__mutmut_28": "n=3 is difflib.get_close_matches' default",
    "x__close_names__mutmut_15": "n=3 is difflib.get_close_matches' default",
    # _search_space
    "x_build_search_space__mutmut_43": "a longer 'where' list: parse_overrides reads where[i] for the lines only",
    # _command
    "x_app_arguments__mutmut_17": "split('=') and split('=', 1) have the same first element",
    "x_app_arguments__mutmut_20": "split('=', 2) and split('=', 1) have the same first element",
    "x_app_arguments__mutmut_26": "split('=') and split('=', 1) have the same first element",
    "x_app_arguments__mutmut_29": "split('=', 2) and split('=', 1) have the same first element",
    "x_config_flags__mutmut_24": "split('=') and split('=', 1) have the same first element",
    "x_config_flags__mutmut_27": "split('=', 2) and split('=', 1) have the same first element",
    "x_rerun_line__mutmut_8": "lstrip('XX+~XX') also strips a leading 'X'; a Hydra override starts with hydra, + or ~",
    "x_rerun_line__mutmut_15": "as _8: no hydra.* override starts with 'X'",
    # _override_text
    "x_command_line_overrides__mutmut_12": "resolve=None is falsy: the same call as resolve=False",
    "x_command_line_overrides__mutmut_14": "OmegaConf.to_container's default is resolve=False: the same call",
    # _agree
    "x__plain_value__mutmut_22": "a 0-d NumPy array, NumPy scalar or torch tensor gives the same Python scalar from "
                                 "item() and tolist(); the mutant reads tolist() where item() is there",
    "x__plain_value__mutmut_23": "as _22: tolist() instead of item(), the same scalar for NumPy and torch",
    "x__plain_value__mutmut_28": "as _22: tolist() instead of item(), the same scalar for NumPy and torch",
    "x__plain_value__mutmut_29": "as _22: tolist() instead of item(), the same scalar for NumPy and torch",
    "x_differing_keys__mutmut_10": "a key missing from the first config is in another (the keys are their union), "
                                   "and that config's own KeyError sentinel already differs from None: same result",
    "x_differing_keys__mutmut_12": "get(k) is get(k, None): the same as _10",
    "xǁStopCheckǁreason__mutmut_10": "only COMPLETE and PRUNED trials are read, and Optuna stores no value for a PRUNED "
                                     "trial, so 'COMPLETE or has a value' and 'COMPLETE and has a value' are the same",
}

# Survivors of a module's last run that a row added after that run kills (no time to rerun the module): the row,
# and how that was checked (the mutant applied by hand to a copy of the tree, the row run on it). Listed apart in
# the result file; the module's figures stay those of its run.
KILLED_AFTER: dict[str, str] = {
    "x_summary_table__mutmut_7": "tests/test_results.py::test_summary_table_when_the_best_trials_cannot_be_read "
                                 "(3683689); fails on the mutant applied by hand",
}

# mutmut 3's exit-code statuses, grouped as this table counts them.
KILLED = {"killed", "timeout", "segfault"}
SURVIVED = {"survived", "suspicious"}
NO_TESTS = {"no tests"}


def _tracked() -> list[str]:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [name for name in files.decode().split("\0") if name and (ROOT / name).exists()]


def _copy_tree(dest: Path) -> None:
    for name in _tracked():
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run_module(name: str, jobs: int, mutmut: str) -> dict:
    """Mutate one module and return its counts and survivors.

    Returns ``{"module", "path", "tests", "seconds", "counts": {status: n}, "survivors": [{"name", "status",
    "diff"}]}``; ``seconds`` is wall time. Raises ``SystemExit`` when mutmut's run fails outright."""
    path, tests = MODULES[name]
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        # mutmut copies only source_paths and tests/ into mutants/, where the tests run: the rest of the tree
        # (README.md, examples/, bench/ ...) goes with them, or a test reading it fails mutmut's baseline run
        # and every mutant is "not checked". Torchrun tests are left out, whatever the selection holds.
        also = sorted({Path(f).parts[0] for f in _tracked()} - {"hydra_plugins", "tests", "setup.cfg"})
        (work / "setup.cfg").write_text(
            "[mutmut]\nsource_paths=hydra_plugins\n"
            f"only_mutate={path}\n"
            "also_copy=" + "\n    ".join(also) + "\n"
            "pytest_add_cli_args_test_selection=" + "\n    ".join(tests) + "\n"
            "pytest_add_cli_args=-p\n    no:cacheprovider\n    -q\n    -m\n    not torchrun\n"
            # torch in the tests is not fork-safe (threads): fork each mutant from a server process (mutmut docs)
            "process_isolation=forkserver\n"
        )
        t0 = time.monotonic()
        run = subprocess.run([mutmut, "run", "--max-children", str(jobs)], cwd=work, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        listing = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True)
        statuses: dict[str, str] = {}
        for line in listing.stdout.splitlines():
            found = re.match(r"\s+(\S+): (.+)$", line)
            if found:
                statuses[found.group(1)] = found.group(2).strip()
        if not statuses:
            raise SystemExit(f"{name}: mutmut ran no mutant (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status] = counts.get(status, 0) + 1
        if not set(counts) & (KILLED | SURVIVED):  # e.g. the baseline run of the selected tests failed
            raise SystemExit(f"{name}: mutmut checked no mutant ({counts}); rc {run.returncode}:\n"
                             f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        survivors = []
        for mutant, status in sorted(statuses.items()):
            if status in SURVIVED | NO_TESTS:
                shown = subprocess.run([mutmut, "show", mutant], cwd=work, capture_output=True, text=True)
                survivors.append({"name": mutant, "status": status, "diff": shown.stdout.strip()})
    return {"module": name, "path": path, "tests": tests, "seconds": round(seconds, 1), "counts": counts,
            "survivors": survivors}


def _share(counts: dict[str, int]) -> tuple[int, int, int, int, float]:
    total = sum(n for status, n in counts.items() if status != "skipped")
    killed = sum(counts.get(s, 0) for s in KILLED)
    survived = sum(counts.get(s, 0) for s in SURVIVED)
    untested = sum(counts.get(s, 0) for s in NO_TESTS)
    return total, killed, survived, untested, (100.0 * killed / total if total else 100.0)


def table(results: list[dict]) -> str:
    """The per-module table (markdown): mutants, killed, survived, no test, % killed, seconds."""
    lines = ["| module | tests | mutants | killed | of which timeout | survived | explained | no test | killed % | "
             "seconds | commit |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for res in results:
        total, killed, survived, untested, share = _share(res["counts"])
        tests = ", ".join(Path(t).name for t in res["tests"])
        explained = sum(surv["name"].split(".")[-1] in EXPLAINED for surv in res["survivors"])
        lines.append(f"| `{res['module']}` | {tests} | {total} | {killed} | {res['counts'].get('timeout', 0)} | "
                     f"{survived} | {explained} | {untested} | "
                     f"{share:.1f} | {res['seconds']:.0f} | {res.get('commit', '?')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="*", default=list(MODULES), choices=list(MODULES))
    parser.add_argument("--jobs", type=int, default=2, help="mutmut's --max-children")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mutation")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other modules' rows of the existing result file (each row names its commit) "
                             "and replace only the modules run now")
    parser.add_argument("--merge-from", type=Path, nargs="*", default=[],
                        help="with --merge: also take the rows of these result files (later files, then the modules "
                             "run now, win); '--modules' with no module then only combines the files")
    args = parser.parse_args(argv)
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if not mutmut:
        raise SystemExit("mutmut is not installed: pip install -e '.[mutation]' (or make mutation)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    if dirty:
        commit += "+dirty"  # the tree copied is git ls-files as on disk: say so when it is not the commit
    results = []
    for name in args.modules:
        print(f"mutating {name} ...", flush=True)
        results.append({**run_module(name, args.jobs, mutmut), "commit": commit})
        print(table(results[-1:]).splitlines()[-1], flush=True)
    commands = ["python bench/mutation.py --modules " + " ".join(args.modules) + f" --jobs {args.jobs}"
                + (" --merge" if args.merge else "")]
    json_path = args.out.with_suffix(".json")
    if args.merge:
        rows: dict[str, dict] = {}
        earlier: list[str] = []
        for path in [json_path, *args.merge_from]:
            if not path.exists():
                continue
            old = json.loads(path.read_text())
            rows.update({res["module"]: {"commit": old.get("commit", "?"), **res} for res in old["results"]})
            earlier += [c for c in old.get("commands", [old["command"]]) if c not in earlier]
        rows.update({res["module"]: res for res in results})
        results = sorted(rows.values(), key=lambda res: list(MODULES).index(res["module"]))
        commands = [c for c in earlier if c not in commands] + (commands if args.modules else [])
    command = "; ".join(commands)
    text = table(results)
    md = [text, "", "Each row was run at the commit it names (+dirty: uncommitted edits in the copied tree). Killed "
          "counts mutmut's timeouts (the tests ran past its CPU limit on the mutant). Target 90% per module.", "",
          "## Survivors", "",
          "Each survivor's diff; the explanation of those no table row kills follows in Explained.", ""]
    explained, later, unexplained = [], [], []
    for res in results:
        for surv in res["survivors"]:
            key = surv["name"].split(".")[-1]
            if key in EXPLAINED:
                explained.append(f"- `{res['module']}` `{key}`: {EXPLAINED[key]}")
            elif key in KILLED_AFTER:
                later.append(f"- `{res['module']}` `{key}`: {KILLED_AFTER[key]}")
            else:
                unexplained.append(f"- `{res['module']}` `{key}`")
            md += [f"### {surv['name']} ({surv['status']})", "", "```diff", surv["diff"], "```", ""]
    md += ["## Explained", "", *(explained or ["(none)"]), "",
           "## Killed by a row added after the module's run", "", *(later or ["(none)"]), "",
           "## Neither killed nor explained", "", *(unexplained or ["(none)"]), ""]
    save(args.out.name, "\n".join(md), {"commit": commit, "commands": commands, "results": results}, command,
         out=args.out.parent)

if __name__ == "__main__":
    main()
