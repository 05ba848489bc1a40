"""Generate the reference pages' tables from the code, so that the code stays their one source.

- ``docs/reference/config.md``: every ``hydra.sweeper.*`` key, walked from the config dataclasses
  (``hydra_plugins/ds_optuna_sweeper/config.py``, the scheduler group of ``_config_groups.py``) with the
  comment above each field (or, for a nested node, its class docstring) as the description;
- ``docs/reference/stored.md``: the table of what the sweeper stores in a study, from
  ``hydra_plugins/ds_optuna_sweeper/_study/_stored.py`` (``markdown_table()``), between two markers.

``python docs/gen_reference.py`` writes both (``make docs`` runs it first); ``--check`` exits 1 when a committed
page differs from what the code gives (``tests/test_docs_site.py`` runs the same check, and fails when a key has
no description).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hydra_plugins" / "ds_optuna_sweeper"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"
STORED_PAGE = ROOT / "docs" / "reference" / "stored.md"
STORED_START, STORED_END = "<!-- generated: stored keys (docs/gen_reference.py) -->", "<!-- end of generated table -->"

#: Keys of the schema that are Hydra's plumbing, not settings.
HIDDEN = {"_target_", "_recursive_", "defaults"}

#: Where each top-level key is explained at length (relative to docs/reference/).
SEE = {
    "sampler": "../how-to/samplers-and-pruners.md",
    "pruner": "../how-to/samplers-and-pruners.md",
    "scheduler": "../how-to/schedulers.md",
    "storage": "../how-to/shared-studies.md",
    "n_trials": "../how-to/checkpoints.md#resume",
    "n_jobs": "../how-to/trial-groups.md",
    "stop": "../how-to/stop-rules.md",
    "enqueue_trials": "../how-to/warm-starts.md",
    "retry_failed_trials": "failures.md",
    "heartbeat_interval": "../how-to/shared-studies.md",
    "grace_period": "../how-to/shared-studies.md",
    "storage_retry_timeout": "../how-to/shared-studies.md#the-connection-drops",
    "refit": "../how-to/refit.md",
    "checkpoints": "../how-to/checkpoints.md",
    "tracking": "../how-to/tracking.md",
    "plots": "results.md",
    "params": "../tutorial/ddp-sweep.md#the-sweep-grammar",
}


@dataclasses.dataclass
class Row:
    key: str
    type: str
    default: str
    description: str


def _field_comments(path: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """``{class name: {field: (annotation, comment above it)}}`` for every class of the module at ``path``."""
    source = path.read_text()
    lines = source.splitlines()
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                comment, i = [], item.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#"):
                    comment.insert(0, lines[i].strip().lstrip("#").strip())
                    i -= 1
                fields[item.target.id] = (ast.unparse(item.annotation), " ".join(comment))
        found[node.name] = fields
    return found


def _value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _doc(cls) -> str:
    """A class docstring's text on one line (its first paragraph)."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def _escape(text: str) -> str:
    """Text for a Markdown table cell: reST's double backticks as Markdown code, pipes escaped, and outside code
    spans ``<name>`` placeholders shown rather than read as HTML."""
    parts = re.split(r"(`[^`]*`)", text.replace("``", "`"))
    return "".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
                   for i, part in enumerate(parts)).replace("|", "\\|")


def config_rows() -> list[Row]:
    """One row per ``hydra.sweeper`` key, in the schema's order, nested nodes followed by their keys."""
    sys.path.insert(0, str(ROOT))
    from hydra_plugins.ds_optuna_sweeper import _config_groups, config

    comments = _field_comments(PACKAGE / "config.py")
    comments.update({k: v for k, v in _field_comments(PACKAGE / "_config_groups.py").items() if k not in comments})
    group_defaults = {k: v for d in config._DEFAULTS for k, v in d.items()}
    groups = {"sampler": _config_groups.SAMPLERS, "pruner": _config_groups.PRUNERS,
              "scheduler": _config_groups.SCHEDULERS}
    rows: list[Row] = []

    def walk(cls, prefix: str) -> None:
        instance = cls()
        for f in dataclasses.fields(cls):
            if f.name in HIDDEN:
                continue
            annotation, comment = comments[cls.__name__].get(f.name, ("", ""))
            key = prefix + f.name
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(f.type) or dataclasses.is_dataclass(value):
                rows.append(Row(key, "node", "", comment or _doc(type(value))))
                walk(type(value), key + ".")
                continue
            if key in groups:
                options = ", ".join(f"`{name}`" for name in groups[key])
                rows.append(Row(key, f"group `hydra/sweeper/{key}`", group_defaults[key],
                                f"{comment} Options: {options}." if comment else ""))
                continue
            rows.append(Row(key, annotation, _value(value), comment))

    walk(config.DSOptunaSweeperConf, "")
    # The scheduler group's settings (hydra/sweeper/scheduler=asha, pbt), after the scheduler's own row: one row per
    # key, saying which schedulers take it (max_steps: both, each with its own comment).
    at = next(i for i, r in enumerate(rows) if r.key == "scheduler") + 1
    by_key: dict[str, list[tuple[str, str, str, str]]] = {}  # key -> [(scheduler, annotation, default, comment)]
    for name, cls in _config_groups.SCHEDULERS.items():
        instance = cls()
        for f in dataclasses.fields(cls):
            if f.name == "name":
                continue
            annotation, comment = comments[cls.__name__].get(f.name, ("", ""))
            by_key.setdefault(f.name, []).append((name, annotation, _value(getattr(instance, f.name)), comment))
    extra = []
    for key, takers in by_key.items():
        if any(not comment for *_, comment in takers):
            description = ""  # a missing comment fails the description test
        elif len({comment for *_, comment in takers}) == 1:
            description = f"({', '.join(f'`{n}`' for n, *_ in takers)} only) {takers[0][3]}"
        else:
            description = " ".join(f"(`{n}`) {comment}" for n, _, _, comment in takers)
        defaults = {default for _, _, default, _ in takers}
        extra.append(Row(f"scheduler.{key}", takers[0][1], defaults.pop() if len(defaults) == 1 else
                         ", ".join(f"{d} (`{n}`)" for n, _, d, _ in takers), description))
    rows[at:at] = extra
    return rows


def group_options_markdown() -> str:
    """The sampler and pruner options with the Optuna class each builds and its arguments' defaults."""
    from hydra_plugins.ds_optuna_sweeper import _config_groups

    out = []
    for group, options in (("sampler", _config_groups.SAMPLERS), ("pruner", _config_groups.PRUNERS)):
        out += [f"| `hydra/sweeper/{group}=` | builds | arguments (Optuna's own, with their defaults) |", "|---|---|---|"]
        for name, cls in options.items():
            instance = cls()
            args = ", ".join(f"`{f.name}={_value(getattr(instance, f.name))}`" for f in dataclasses.fields(cls)
                             if f.name not in HIDDEN and f.name != "_target_")
            out.append(f"| `{name}` | `{instance._target_}` | {_escape(args) or '-'} |")
        out.append("")
    return "\n".join(out)


def config_page() -> str:
    rows = config_rows()
    lines = [
        "# Configuration reference (`hydra.sweeper.*`)",
        "",
        "<!-- Generated by docs/gen_reference.py from hydra_plugins/ds_optuna_sweeper/config.py and",
        "     _config_groups.py: edit the comments there, then run `python docs/gen_reference.py`. -->",
        "",
        "Every key of `hydra/sweeper=ds_optuna`, generated from the config dataclasses and the comment on each",
        "field. Set a key on the command line (`hydra.sweeper.n_trials=40`) or in your config under",
        "`hydra: sweeper:`. An unknown key stops the run before anything starts, naming the key, the likely fix and",
        "the valid keys. Sweeper keys written at the top of the task config (`direction: maximize` next to the",
        "`override hydra/sweeper` line) are warned about: they do nothing there. To see every key with the value a",
        "run will use, print Hydra's config: `python examples/ddp_mlp.py --cfg hydra` (with your own script and",
        "overrides; Hydra refuses `--cfg` together with `-m`).",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for r in rows:
        top = r.key.split(".")[0]
        see = f" See [{SEE[top].split('/')[-1].split('#')[0][:-3]}]({SEE[top]})." if top in SEE and "." not in r.key else ""
        default = f"`{r.default}`" if r.default else ""
        lines.append(f"| `{r.key}` | {_escape(r.type)} | {_escape(default)} | {_escape(r.description)}{see} |")
    lines += [
        "",
        "## Sampler and pruner options",
        "",
        "Choose an option with `hydra/sweeper/sampler=<name>` (or `pruner`), and set its arguments with",
        "`hydra.sweeper.sampler.<argument>=<value>`. Settings of one option belong in an option file of your",
        "app (see [Samplers, pruners and constraints](../how-to/samplers-and-pruners.md)).",
        "",
        group_options_markdown().rstrip(),
        "",
    ]
    return "\n".join(lines)


def stored_page(current: str) -> str:
    """``current`` (the stored-keys page) with the table between the markers regenerated."""
    from hydra_plugins.ds_optuna_sweeper._study import _stored

    head, rest = current.split(STORED_START, 1)
    _, tail = rest.split(STORED_END, 1)
    return f"{head}{STORED_START}\n{_stored.markdown_table()}\n{STORED_END}{tail}"


def generated() -> dict[Path, str]:
    sys.path.insert(0, str(ROOT))
    return {CONFIG_PAGE: config_page(), STORED_PAGE: stored_page(STORED_PAGE.read_text())}


def main(argv: list[str]) -> int:
    stale = []
    for path, text in generated().items():
        if path.read_text() != text if path.exists() else True:
            stale.append(path)
            if "--check" not in argv:
                path.write_text(text)
    if "--check" in argv and stale:
        print("stale (run python docs/gen_reference.py):", *[str(p.relative_to(ROOT)) for p in stale])
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
