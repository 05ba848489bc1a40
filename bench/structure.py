"""The product's structure, measured from its source: the static measures of issue 40 ("One control plane").

Prints one table per measure, read from ``hydra_plugins/ds_optuna_sweeper`` with :mod:`ast` (nothing is
imported or run), so each step of the control-plane work can say what it moved:

- lines: every line of the package's ``.py`` files, and its code lines (not blank, not a comment, not a
  docstring);
- the modules over 400 lines, the classes over 250 and the functions over 60 (the limits of issue 40, "One control
  plane", in the project's issue list; a function's
  lines run from its ``def`` to its last statement, docstring included);
- import circles: the strongly connected components (more than one module) of the graph of the package's own
  imports, module level and inside functions alike, ``TYPE_CHECKING`` blocks left out;
- folders importing each other both ways (``_loop`` -> ``_task`` and ``_task`` -> ``_loop``), with the module
  imports that make each pair;
- the places that start a thread (``threading.Thread``/``threading.Timer``) or set a signal handler
  (``signal.signal``), by module.

Usage (the project's venv: networkx, which finds the circles, comes with torch)::

    python bench/structure.py            # the tables
    python bench/structure.py --json     # the same figures as one JSON object

Exit status 0 always: the figures are a measure, not a gate.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hydra_plugins.ds_optuna_sweeper"
SOURCE = ROOT / "hydra_plugins" / "ds_optuna_sweeper"
LIMITS = {"module": 400, "class": 250, "function": 60}
PLURAL = {"module": "modules", "class": "classes", "function": "functions"}


def module_name(path: Path) -> str:
    """``.../ds_optuna_sweeper/_loop/_driver.py`` -> ``hydra_plugins.ds_optuna_sweeper._loop._driver``."""
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def short(module: str) -> str:
    """``hydra_plugins.ds_optuna_sweeper._loop._driver`` -> ``_loop._driver`` (other names unchanged)."""
    return module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module


def folder_of(module: str) -> str:
    """The first folder under the package (``_loop``, also for ``_loop/__init__.py``), or ``.`` for a top-level
    module."""
    rest = short(module).split(".") if module != PACKAGE else []
    return rest[0] if len(rest) > 1 or (rest and (SOURCE / rest[0]).is_dir()) else "."


def code_lines(text: str, tree: ast.Module) -> int:
    """Lines holding code: not blank, not only a comment, not inside a docstring."""
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - doc_lines)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package modules one ``from ... import ...`` names (a name may be a submodule or an attribute)."""
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith(PACKAGE):
        return []
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def _in_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def measure() -> dict:
    """Every figure the tables print, as one JSON-ready dict."""
    files = sorted(p for p in SOURCE.rglob("*.py"))
    modules = {module_name(p): p for p in files}
    lines_all = lines_code = 0
    big: dict[str, list[tuple[str, int]]] = {"module": [], "class": [], "function": []}
    edges: dict[str, set[str]] = defaultdict(set)
    threads: dict[str, int] = defaultdict(int)
    signals: dict[str, int] = defaultdict(int)
    for module, path in modules.items():
        text = path.read_text()
        tree = ast.parse(text)
        n = len(text.splitlines())
        lines_all += n
        lines_code += code_lines(text, tree)
        if n > LIMITS["module"]:
            big["module"].append((module, n))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                length = node.end_lineno - node.lineno + 1
                if length > LIMITS[kind]:
                    big[kind].append((f"{module}:{node.name}", length))
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not _in_type_checking(node, parents):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else _resolve(module, path.name == "__init__.py", node))
                for name in names:
                    while name and name not in modules:
                        name = name.rpartition(".")[0]
                    if name and name != module:
                        edges[module].add(name)
            elif isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called in ("threading.Thread", "threading.Timer", "Thread", "Timer"):
                    threads[module] += 1
                elif called == "signal.signal":
                    signals[module] += 1
    folder_edges: dict[tuple[str, str], set[str]] = defaultdict(set)  # (from folder, to folder) -> "module -> module"
    for src, targets in edges.items():
        for dst in targets:
            if folder_of(src) != folder_of(dst) and "." not in (folder_of(src), folder_of(dst)):
                folder_edges[folder_of(src), folder_of(dst)].add(f"{short(src)} -> {short(dst)}")
    both_ways = [{"folders": [a, b], "imports": sorted(folder_edges[a, b] | folder_edges[b, a])}
                 for a, b in sorted(pair for pair in folder_edges if pair[0] < pair[1] and pair[::-1] in folder_edges)]
    return {
        "lines": lines_all, "code_lines": lines_code, "modules": len(modules),
        "over_limit": {k: sorted(v, key=lambda x: -x[1]) for k, v in big.items()},
        "import_circles": circles(edges),
        "folders_both_ways": both_ways,
        "thread_sites": dict(sorted(threads.items())), "signal_handler_sites": dict(sorted(signals.items())),
    }


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (networkx's, which torch installs), each as
    sorted short names."""
    import networkx

    graph = networkx.DiGraph((src, dst) for src, targets in edges.items() for dst in targets)
    return sorted(sorted(short(m) for m in component)
                  for component in networkx.strongly_connected_components(graph) if len(component) > 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    figures = measure()
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"| package | modules | lines | code lines |\n|---|---:|---:|---:|\n"
          f"| {PACKAGE} | {figures['modules']} | {figures['lines']} | {figures['code_lines']} |\n")
    for kind, limit in LIMITS.items():
        rows = figures["over_limit"][kind]
        print(f"{PLURAL[kind]} over {limit} lines: {len(rows)}")
        for name, length in rows:
            print(f"  {length:5d}  {short(name)}")
    print(f"\nimport circles: {len(figures['import_circles'])}")
    for component in figures["import_circles"]:
        print("  " + " <-> ".join(component))
    print(f"\nfolders importing each other both ways: {len(figures['folders_both_ways'])}")
    for pair in figures["folders_both_ways"]:
        print(f"  {pair['folders'][0]} <-> {pair['folders'][1]}, through:")
        for edge in pair["imports"]:
            print(f"    {edge}")
    for title, key in (("thread starts", "thread_sites"), ("signal.signal calls", "signal_handler_sites")):
        sites = figures[key]
        print(f"\n{title}: {sum(sites.values())} in {len(sites)} modules")
        for module, count in sites.items():
            print(f"  {count}  {short(module)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
