"""Every relative link in README.md and docs/ names a file inside the repository that exists (a clone has
nothing outside it, so a link there is dead for everyone who clones it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def doc_links() -> list[tuple[Path, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out += [(doc, target) for target in LINK.findall(doc.read_text(encoding="utf-8"))]
    return out


def broken(doc: Path, target: str) -> str | None:
    """Why the link is dead or leaves the repository (None: fine)."""
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        return None  # a URL or an anchor in the same page
    path = (doc.parent / target.split("#")[0]).resolve()
    if not path.is_relative_to(ROOT):
        return "points outside the repository"
    if not path.exists():
        return "names no file"
    return None


def test_the_docs_have_links_to_check():
    assert any(not re.match(r"[a-z]+:", t) for _, t in doc_links())


def test_no_doc_link_leaves_the_repository_or_dangles():
    bad = [f"{doc.relative_to(ROOT)}: {target} {why}" for doc, target in doc_links()
           if (why := broken(doc, target)) is not None]
    assert not bad, "\n".join(bad)


def test_a_link_outside_is_caught(tmp_path):
    assert broken(ROOT / "README.md", "../shared/DESIGN.md") == "points outside the repository"
    assert broken(ROOT / "README.md", "docs/no-such-page.md") == "names no file"
    assert broken(ROOT / "README.md", "docs/architecture.md") is None
