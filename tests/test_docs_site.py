"""The documentation site (issue 43): it builds with ``mkdocs build --strict`` (a broken link, a missing page or a
page left out of the nav fails), its generated reference pages match the code, and every ``hydra.sweeper`` key
has a description.

The configuration reference (``docs/reference/config.md``) and the stored-keys table (``docs/reference/stored.md``)
are written by ``docs/gen_reference.py`` from the config dataclasses and ``_study/_stored.py``: the comments in
the code are their one source, and a page not regenerated after a change fails here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.docs_text import DOCS, REPO, page, readme


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_every_sweeper_key_has_a_description():
    rows = _generator().config_rows()
    missing = [r.key for r in rows if not r.description.strip()]
    assert not missing, f"hydra.sweeper keys without a description (add a comment above the field): {missing}"


def test_every_key_of_the_schema_is_in_the_reference():
    """Each field of the sweeper's dataclasses, walked here independently of the generator, is a row."""
    from hydra_plugins.ds_optuna_sweeper import config

    def keys(cls, prefix=""):
        for f in dataclasses.fields(cls):
            if f.name in ("_target_", "_recursive_", "defaults"):
                continue
            value = getattr(cls(), f.name)
            yield prefix + f.name
            if dataclasses.is_dataclass(value):
                yield from keys(type(value), prefix + f.name + ".")

    text = page("reference/config.md")
    missing = [k for k in keys(config.DSOptunaSweeperConf) if f"| `{k}` |" not in text]
    assert not missing, missing
    for name in ("min_steps", "max_steps", "reduction_factor", "keep_paused"):
        assert f"| `scheduler.{name}` |" in text


def test_the_generated_pages_are_up_to_date():
    stale = [p.relative_to(REPO).as_posix() for p, text in _generator().generated().items() if p.read_text() != text]
    assert not stale, f"{stale} differ from the code: run python docs/gen_reference.py"


def test_the_generator_reports_a_key_without_a_description(tmp_path, monkeypatch):
    """The oracle: a field with no comment above it gives an empty description, which the test above reports."""
    gen = _generator()
    comments = gen._field_comments(REPO / "hydra_plugins" / "ds_optuna_sweeper" / "config.py")
    assert comments["DSOptunaSweeperConf"]["n_trials"][1].startswith("The study's total budget")
    source = tmp_path / "c.py"
    source.write_text("class A:\n    # described\n    x: int = 1\n    y: int = 2\n")
    assert gen._field_comments(source)["A"] == {"x": ("int", "described"), "y": ("int", "")}


def test_the_readme_stays_short_and_links_the_site():
    text = readme()
    assert len(text.splitlines()) <= 200
    for command in ("make demo", "make test", "make docs", "make docs-serve"):
        assert command in text, command


#: What the full .venv has and the docs' own environment (``.venv-docs``, docs/requirements.txt) has not.
TRAINING_LIBRARIES = ("torch", "optuna", "transformers", "deepspeed", "accelerate", "peft", "lightning", "numpy")


def _without_training_libraries(module: str) -> str:
    """Python code that runs ``module`` as ``python -m module`` would, with every :data:`TRAINING_LIBRARIES` name
    unimportable (``None`` in ``sys.modules``: ``import torch`` raises ImportError)."""
    return (f"import runpy, sys; sys.modules.update(dict.fromkeys({TRAINING_LIBRARIES!r})); "
            f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def test_the_reference_generator_needs_no_training_library():
    """``make docs`` runs ``docs/gen_reference.py`` in ``.venv-docs`` (no torch, no optuna): its ``--check`` must
    pass with them unimportable."""
    code = (f"import runpy, sys; sys.modules.update(dict.fromkeys({TRAINING_LIBRARIES!r})); "
            f"sys.argv = ['gen_reference.py', '--check']; runpy.run_path({str(DOCS / 'gen_reference.py')!r}, "
            "run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # The oracle: the same way of blocking does stop an import of torch.
    block = f"import sys; sys.modules.update(dict.fromkeys({TRAINING_LIBRARIES!r}));"
    res = subprocess.run([sys.executable, "-c", block + " import torch"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "import of torch halted" in res.stderr, res.stderr[-2000:]


def test_the_docs_environment_holds_the_docs_extra_and_the_generators_imports():
    """docs/requirements.txt (``.venv-docs``) lists the ``docs`` extra of pyproject.toml and hydra-core and
    omegaconf at the core's pins, and nothing of the training stack."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = set(project["optional-dependencies"]["docs"])
    wanted |= {d for d in project["dependencies"] if d.split(">")[0].split("<")[0] in ("hydra-core", "omegaconf")}
    lines = {line.strip() for line in (DOCS / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert lines == wanted, (sorted(lines), sorted(wanted))


@pytest.mark.timeout(120)
def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict`` of the site, as ``make docs`` runs it (into a temporary folder here), with the
    training libraries made unimportable: ``make docs`` builds in ``.venv-docs``, which has none of them."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", _without_training_libraries("mkdocs"), "build", "--strict",
                          "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=110, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    for built in ("index.html", "reference/config/index.html", "reference/api/index.html", "design/index.html"):
        assert (tmp_path / "site" / built).is_file(), built
    assert "current_trial" in (tmp_path / "site" / "reference/api/index.html").read_text()


#: Pages written for users: no case ids there (they belong to the contributing pages and docs/cases.md). The
#: maintainers' notes the code cites (design.md, hydra-internals.md, deepspeed-cpu.md) keep theirs.
USER_PAGES = ("index.md", "getting-started.md", "performance.md", "tutorial", "how-to", "reference", "explanation")


def test_no_case_ids_in_the_readme_or_the_user_pages():
    import re

    found = []
    texts = {"README.md": readme()}
    for name in USER_PAGES:
        paths = [DOCS / name] if name.endswith(".md") else sorted((DOCS / name).rglob("*.md"))
        texts.update({p.relative_to(REPO).as_posix(): p.read_text() for p in paths})
    for name, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            if m := re.search(r"\bC\d{2}\b", line):
                found.append(f"{name}:{number}: {m.group(0)}")
    assert not found, found
