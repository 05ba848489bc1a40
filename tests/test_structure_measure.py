"""``bench/structure.py``, the static measures of issue 40: its import-circle finder, its code-line count and
its reading of relative imports, each on a small input whose answer is known; and the one measure kept as a
rule from stop 47 on, no import circle in the package."""

import ast
import importlib.util

from tests.torchrun_utils import REPO

_spec = importlib.util.spec_from_file_location("structure", REPO / "bench" / "structure.py")
structure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structure)
P = structure.PACKAGE


def test_circles_are_the_components_of_more_than_one_module_and_nothing_else():
    edges = {f"{P}.a": {f"{P}.b"}, f"{P}.b": {f"{P}.c"}, f"{P}.c": {f"{P}.a", f"{P}.d"},
             f"{P}.d": {f"{P}.e"}, f"{P}.e": {f"{P}.d"}, f"{P}.f": {f"{P}.a"}}
    assert structure.circles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert structure.circles({f"{P}.a": {f"{P}.b"}, f"{P}.b": set()}) == []


def test_code_lines_leave_out_blanks_comments_and_docstrings_but_count_a_multi_line_statement_whole():
    text = '"""Module doc.\n\nMore."""\n\n# a comment\nx = (1,\n     2)\n\n\ndef f():\n    """Doc."""\n    return x\n'
    assert structure.code_lines(text, ast.parse(text)) == 4  # x = (1, / 2) / def f(): / return x


def test_relative_imports_resolve_to_the_package_modules_they_name():
    node = ast.parse("from .._study import _retry, first_line").body[0]
    assert structure._resolve(f"{P}._loop._driver", False, node) == [
        f"{P}._study", f"{P}._study._retry", f"{P}._study.first_line"]
    node = ast.parse("from . import _x").body[0]
    assert structure._resolve(f"{P}._loop", True, node) == [f"{P}._loop", f"{P}._loop._x"]
    assert structure._resolve(f"{P}._loop", True, ast.parse("from os import path").body[0]) == []
    assert structure.folder_of(f"{P}._loop._driver") == "_loop" and structure.folder_of(f"{P}.config") == "."
    assert structure.folder_of(f"{P}._loop") == "_loop"  # the folder's __init__, as `from .._loop import x` names it


def test_the_package_has_no_import_circle():
    """Issue 40's measure, kept from here on: no two modules of the package import each other, directly or
    through others (module-level and function-level imports alike)."""
    assert structure.measure()["import_circles"] == []


def test_no_two_folders_of_the_package_import_each_other():
    """Issue 40's measure, kept from here on: the folders stack (docs/design.md, "Which folder may import which"),
    so no folder imports one that imports it back; what a lower folder needs lives in it or below."""
    assert structure.measure()["folders_both_ways"] == []


def test_every_signal_handler_is_set_in_one_module():
    """Issue 40's measure, kept from here on: ``signal.signal`` is called in ``_comm/_signals.py`` only, so the
    sweep's handler, the task's and Lightning's restore cannot fight each other from three places."""
    assert [structure.short(m) for m in structure.measure()["signal_handler_sites"]] == ["_comm._signals"]


def test_no_module_class_or_function_is_over_issue_40s_sizes():
    """Issue 40's measures, kept from here on: no module over 400 lines, no class over 250, no function over 60."""
    assert structure.measure()["over_limit"] == {"module": [], "class": [], "function": []}


_STORE_CALLS = {"set", "get", "check", "add", "wait", "queue_push", "queue_pop", "queue_len", "delete_key",
                "multi_set", "multi_get", "compare_set", "PrefixStore"}


def _spelled_keys(tree: ast.AST) -> list[str]:
    """Store calls whose key is written out (a string or f-string, or a list of them) instead of built by
    ``_comm/_wire.py``: receivers named like a store (``store``, ``self._store``, ``ctx.store``, ``self._look``)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        receiver, name = ast.unparse(node.func.value), node.func.attr
        if name not in _STORE_CALLS or not (name == "PrefixStore" or "store" in receiver.lower() or "_look" in receiver):
            continue
        key = node.args[0]
        keys = key.elts if isinstance(key, (ast.List, ast.Tuple)) else [key]
        if any(isinstance(k, (ast.JoinedStr, ast.Constant)) and not isinstance(getattr(k, "value", ""), (int, float))
               for k in keys):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_every_store_key_is_built_by_the_wire_table():
    """Issue 40 item 1's table: no module but ``_comm/_wire.py`` spells a key or prefix of torchrun's store, so
    ``_wire.STORE_KEYS`` lists them all. Positive control first: the scan finds a spelled key."""
    assert _spelled_keys(ast.parse('store.set(f"ds_optuna/x/{rank}", "1")\nctx.store.check(["a"])')) != []
    assert _spelled_keys(ast.parse('node.get("goal")\nstore.set(_wire.LAUNCH_END, why)')) == []
    spelled = {}
    for path in sorted(structure.SOURCE.rglob("*.py")):
        if path.name != "_wire.py":
            found = _spelled_keys(ast.parse(path.read_text()))
            if found:
                spelled[str(path.relative_to(structure.SOURCE))] = found
    assert spelled == {}


def test_each_key_the_wire_builds_has_its_row_in_the_table():
    """``_wire.STORE_KEYS`` lists every key its functions build, in the store that holds it."""
    import re

    from hydra_plugins.ds_optuna_sweeper._comm import _wire as w

    calls = w.calls_namespace(3, 0)
    built = {
        "launch": [w.GROUP_ID, w.sweep_dir_key("run-a")],
        "attempt": [w.arrival_mark(w.arrival_key("trial result", 3), 1), w.LAUNCH_END, w.RESULTS_WRITTEN,
                    w.call_at_key(calls, 1), w.call_mark_key(calls, 2, "report(step=1)", 1)],
        "world": [w.SETUP, w.REQUEST_QUEUE, w.reply_queue(1), w.RESULTS_WRITTEN],
    }
    for store, keys in built.items():
        rows = [re.compile("^" + re.sub(r"<[^>]+>", ".+", re.escape(k.pattern)) + "$") for k in w.STORE_KEYS
                if k.store == store]
        for key in keys:
            assert any(r.match(key) for r in rows), (store, key)
    assert {k.store for k in w.STORE_KEYS} == set(built)


def _folder_imports(source: str, folders: set[str]) -> list[str]:
    """The module-level ``from .<folder>... import`` statements of a root module's ``source``."""
    return [node.module for node in ast.parse(source).body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            and node.module.split(".")[0] in folders]


def test_the_package_roots_modules_import_no_folder_at_module_level():
    """docs/design.md, "Which folder may import which": the root's modules (settings, errors, the upstream adapter)
    sit below every folder. ``__init__.py`` (the public API from ``_task/``) and ``sweeper.py`` (which starts the
    loop inside its methods) are the two doors down."""
    root = REPO / "hydra_plugins" / "ds_optuna_sweeper"
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found = {p.name: _folder_imports(p.read_text(), folders) for p in sorted(root.glob("*.py"))
             if p.name not in ("__init__.py", "sweeper.py")}
    assert {name: mods for name, mods in found.items() if mods} == {}
    # a positive control: the scan flags what stop 49's _settings.py did, and not a function-level import
    assert _folder_imports("from ._study._stop import StopRules\nfrom ._errors import X\n"
                           "def f():\n    from ._loop import y\n", folders) == ["_study._stop"]
