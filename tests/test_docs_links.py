"""Every document the repo cites lives in the repo (issue 22, item 7).

Docstrings, comments, tests and Markdown files point readers at documents. A maintainer who has only the
repo must be able to open each one, so this test fails when a file:

- cites a document kept outside the repo: the design and note files the project started from (the old
  upper-case design, style, cases and review files, the separate notes files), a ``shared`` folder next to
  the repo, or an absolute path of the machine the project was built on;
- cites ``docs/<name>.md`` (or links a Markdown file) that does not exist;
- names a section of a ``docs/`` file (``docs/design.md, "One config"``) that the file does not contain, or
  links a ``#anchor`` that no heading of the target produces.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt", ".sh", ".sbatch", ".rst"}
TEXT_NAMES = {"Makefile"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", "build", "dist", "multirun", "outputs"}

# Built from pieces so that this file's own source does not match them.
_OUTSIDE = [
    (re.compile(r"\b(?:" + "DES" + "IGN|ST" + "YLE|CA" + "SES|REV" + r"IEW)\.md\b"), "a note kept outside the repo"),
    (re.compile(r"\b" + "NOT" + r"ES-[\w-]+\.md\b"), "a note kept outside the repo"),
    (re.compile(r"\.\./" + "shared" + r"\b"), "a folder next to the repo"),
    (re.compile(r"(?<![\w.~-])/" + "work" + r"/[\w.]"), "an absolute path of the build machine"),
    (re.compile(r"(?<![\w.~-])/tmp/" + r"briefs\b"), "an absolute path of the build machine"),
]
_DOCS_CITE = re.compile(r"(?<![\w/.-])docs/([\w./-]+?\.md)(#[\w-]+)?(?:[`'\")\]]?(?:,|:)\s*\"([^\"\n]+)\")?")
_MD_LINK = re.compile(r"\]\(([^)\s]+?\.md)(#[\w-]+)?\)")


def repo_files() -> list[Path]:
    """The repo's text files: git's tracked and untracked-not-ignored files, or a walk without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        paths = [p for p in ROOT.rglob("*") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]
    return sorted(
        p for p in paths
        if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES) and p.resolve() != SELF
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """Anchors of every heading in ``md``."""
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+?)\s*$", md.read_text(encoding="utf-8"), re.M)}


def lines_of(path: Path):
    """``(line number, line)`` pairs of a text file; undecodable files give nothing."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    return list(enumerate(text.splitlines(), 1))


FILES = repo_files()


def test_the_docs_folder_holds_the_documents_the_code_relies_on():
    for name in ("design.md", "hydra-internals.md", "deepspeed-cpu.md", "cases.md", "testing.md"):
        assert (ROOT / "docs" / name).is_file(), f"docs/{name} is missing"


def test_no_file_cites_a_document_outside_the_repo():
    found = []
    for path in FILES:
        for number, line in lines_of(path):
            for pattern, what in _OUTSIDE:
                if m := pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r} ({what})")
    assert not found, "cite docs/<name>.md instead:\n" + "\n".join(found)


def test_every_cited_docs_file_and_section_exists():
    found = []
    for path in FILES:
        for number, line in lines_of(path):
            for m in _DOCS_CITE.finditer(line):
                target = ROOT / "docs" / m.group(1)
                where = f"{path.relative_to(ROOT)}:{number}"
                if not target.is_file():
                    found.append(f"{where}: docs/{m.group(1)} does not exist")
                    continue
                if m.group(2) and m.group(2)[1:] not in anchors(target):
                    found.append(f"{where}: docs/{m.group(1)} has no heading for {m.group(2)}")
                section = m.group(3)
                if section and section.lower() not in target.read_text(encoding="utf-8").lower():
                    found.append(f"{where}: docs/{m.group(1)} has no section {section!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("md", [p for p in FILES if p.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_to_markdown_files_resolve_inside_the_repo(md):
    found = []
    for number, line in lines_of(md):
        for m in _MD_LINK.finditer(line):
            if re.match(r"[a-z]+://", m.group(1)):
                continue
            target = (md.parent / m.group(1)).resolve()
            if ROOT not in target.parents:
                found.append(f"line {number}: {m.group(1)} is outside the repo")
            elif not target.is_file():
                found.append(f"line {number}: {m.group(1)} does not exist")
            elif m.group(2) and m.group(2)[1:] not in anchors(target):
                found.append(f"line {number}: {m.group(1)} has no heading for {m.group(2)}")
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns match the citations they exist to catch, and leave ordinary paths alone."""
    bad = [
        "see " + "DES" + "IGN.md, One sampler",
        "(" + "NOT" + "ES-cpu.md)",
        "Cases from ../" + "shared/cases/x.md",
        "/" + "work/" + "shared/notes.md",
    ]
    for text in bad:
        assert any(p.search(text) for p, _ in _OUTSIDE), text
    fine = ["file_path:/shared/sweeps/minilm.log", "docs/design.md", "README.md", "~/work/x", "a/work/b"]
    for text in fine:
        assert not any(p.search(text) for p, _ in _OUTSIDE), text
    m = _DOCS_CITE.search('compares (docs/design.md, "One config") and')
    assert m and m.group(1) == "design.md" and m.group(3) == "One config"
    assert slug("The sweep dir and `${now:...}`") == "the-sweep-dir-and-now"


# A test cited as ``tests/<path>.py``, ``test_<name>.py`` or either followed by ``::test_<name>`` (``*`` for a prefix).
_TEST_CITE = re.compile(r"(?<![\w/.-])((?:\w+/)*test_\w+\.py)((?:::test_\w+\*?)?)")
#: Test files a test writes for itself (never in the repo).
_WRITTEN_BY_TESTS = {"test_inner.py"}


def _test_files() -> dict[str, list[Path]]:
    """Every test file under tests/, by file name (several folders may hold one name)."""
    found: dict[str, list[Path]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        found.setdefault(path.name, []).append(path)
    return found


def cited_test_problems(text: str, where: str, files: dict[str, list[Path]]) -> list[str]:
    """What is wrong with each test ``text`` cites: a file that no longer exists, or a test name (or a ``*``
    prefix) that no test function of that file has. A bare ``::test_x`` after a file cited earlier on the same
    line is checked against that file too."""
    problems = []
    last: list[Path] = []
    for m in re.finditer(_TEST_CITE.pattern + r"|(?<![\w.])::(test_\w+\*?)", text):
        if m.group(1):
            cited, name = m.group(1), m.group(2)[2:] if m.group(2) else ""
            if Path(cited).name in _WRITTEN_BY_TESTS:
                last = []
                continue
            candidates = [p for p in files.get(Path(cited).name, [])
                          if p.relative_to(ROOT).as_posix() == cited or p.as_posix().endswith("/" + cited)]
            if not candidates:
                problems.append(f"{where}: {cited} does not exist")
                last = []
                continue
            last = candidates
        else:
            name = m.group(3)
            if not last:
                continue
        if name:
            prefix = name.rstrip("*")
            defined = {f for p in last for f in re.findall(r"^\s*def (test_\w+)", p.read_text(encoding="utf-8"), re.M)}
            partial = name.endswith(("*", "_"))  # `_`: a name split over two string literals
            if not any(f == prefix or (partial and f.startswith(prefix)) for f in defined):
                problems.append(f"{where}: no test {name} in {', '.join(str(p.relative_to(ROOT)) for p in last)}")
    return problems


def test_every_cited_test_file_and_test_exists():
    """README's test map, docs/cases.md and docstrings name tests; a renamed or merged test is renamed there too
    (issue 39 moved most launches: a stale name sends a reader to nothing)."""
    files = _test_files()
    found = []
    for path in FILES:
        if path.suffix not in {".md", ".py"} or path.name.startswith("test_docs_links"):
            continue
        for number, line in lines_of(path):
            found += cited_test_problems(line, f"{path.relative_to(ROOT)}:{number}", files)
    assert not found, "\n".join(found)


def test_the_test_citation_check_catches_a_stale_name(tmp_path):
    files = _test_files()
    assert cited_test_problems("`tests/test_docs_links.py::test_every_cited_*`", "x", files) == []
    assert cited_test_problems("`test_docs_links.py::test_every_cited_test_file_and_test_exists`", "x", files) == []
    assert cited_test_problems("`tests/test_gone_for_good.py`", "x", files) == ["x: tests/test_gone_for_good.py does not exist"]
    assert cited_test_problems("`test_docs_links.py::test_no_such_*`, `::test_every_*`", "x", files) == [
        "x: no test test_no_such_* in tests/test_docs_links.py"]
