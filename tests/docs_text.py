"""The documentation's text for the tests that check it: the README and the pages of the site under ``docs/``
(issue 43 moved most of the README there)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def page(name: str) -> str:
    """The text of one page, by its path under ``docs/`` (``"reference/config.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def pages() -> list[Path]:
    """Every Markdown page of the site, in a stable order."""
    return sorted(DOCS.rglob("*.md"))


def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def documents() -> dict[str, str]:
    """``{name: text}`` of the README and every page (name relative to the repository)."""
    found = {"README.md": readme()}
    for path in pages():
        found[path.relative_to(REPO).as_posix()] = path.read_text(encoding="utf-8")
    return found
