"""Every reference into docs/ resolves, and nothing cites the design outside the repository.

A reference is ``docs/<file>.md`` or ``docs/<file>.md#<section>`` in code,
configs, the Makefile or the README; ``<section>`` is the GitHub slug of a
heading of that file. The checker fails on a missing file, a missing section,
a remaining "SPEC <number>" citation (SPEC.md is not in the repository) and a
path into ``shared/``. It tests itself on planted bad references.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ROOMS = ("gyre", "sim", "real", "analysis", "paper_figs", "bench", "tools", "tests", "configs")
TOP_FILES = ("Makefile", "README.md")
SUFFIXES = {".py", ".sh", ".md", ".toml", ".txt", ".cfg", ".yaml", ".yml", ".ini"}

REFERENCE = re.compile(r"\bdocs/([A-Za-z0-9_.-]+?\.md)(?:#([A-Za-z0-9_-]+))?")
SPEC_CITATION = re.compile(r"\bSPEC(?:\.md)?(?:'s)?(?:\s*§\s*|\s+(?:section\s+)?)\d")
SHARED_PATH = re.compile(r"(?<![\w.-])(?:/work/)?(?:\.\./)*shared/(?:notes/|SPEC|STYLE)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def section_slugs(markdown: str) -> set[str]:
    """Anchors of every heading outside code fences, duplicates numbered as GitHub does."""
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = github_slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            slugs.add(base if count == 0 else f"{base}-{count}")
    return slugs


def problems_in(text: str, where: str, docs: Path) -> list[str]:
    """Every broken docs/ reference, SPEC citation and shared/ path in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        at = f"{where}:{number}"
        for match in REFERENCE.finditer(line):
            name, section = match.group(1), match.group(2)
            page = docs / name
            if not page.is_file():
                found.append(f"{at}: docs/{name} does not exist")
            elif section and section not in section_slugs(page.read_text(encoding="utf-8")):
                found.append(f"{at}: docs/{name} has no section #{section}")
        if SPEC_CITATION.search(line):
            found.append(f"{at}: cites SPEC by number (point into docs/ instead): {line.strip()[:80]}")
        if SHARED_PATH.search(line):
            found.append(f"{at}: a path into shared/, which a clone does not have: {line.strip()[:80]}")
    return found


def scanned_files(root: Path) -> list[Path]:
    files = [root / name for name in TOP_FILES if (root / name).is_file()]
    for room in ROOMS:
        files += [
            p
            for p in sorted((root / room).rglob("*"))
            if p.suffix in SUFFIXES and p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
        ]
    return files


def test_every_reference_into_docs_resolves_and_nothing_cites_spec():
    problems = []
    for path in scanned_files(ROOT):
        problems += problems_in(path.read_text(encoding="utf-8", errors="replace"), str(path.relative_to(ROOT)), DOCS)
    assert not problems, "\n".join(problems)


def test_the_scan_covers_code_makefile_and_readme():
    names = {str(p.relative_to(ROOT)) for p in scanned_files(ROOT)}
    assert {"Makefile", "README.md", "gyre/scheduler.py", "tests/core/test_doc_references.py"} <= names


def test_every_doc_page_the_code_cites_has_headings():
    assert DOCS.is_dir()
    for page in DOCS.glob("*.md"):
        assert section_slugs(page.read_text(encoding="utf-8")), f"{page.name} has no heading"


@pytest.mark.parametrize(
    ("planted", "complaint"),
    [
        ("see " + "docs/" + "no-such-page.md", "does not exist"),
        ("see " + "docs/" + "scheduler.md#no-such-section", "has no section"),
        ("the rule of " + "SPEC" + " 3.3", "cites SPEC"),
        ("(" + "SPEC" + ".md 4.5)", "cites SPEC"),
        ("SPEC" + " section 5", "cites SPEC"),
        ("SPEC" + "§3.3 and " + "SPEC" + ".md § 2", "cites SPEC"),
        ("measured in ../" + "shared/" + "no" + "tes/cpu-stack.md", "path into shared/"),
    ],
)
def test_the_checker_fails_on_a_planted_bad_reference(planted, complaint):
    problems = problems_in(planted, "planted.py", DOCS)
    assert len(problems) == 1 and complaint in problems[0], problems


def test_the_checker_accepts_good_references_and_look_alikes():
    good = (
        "docs/scheduler.md#counters, docs/scheduler.md and docs/workload.md#hard-queries; "
        "SPEC51_KEPT_SHARE, SPEC_ABLATIONS, workspace_setup SPEC -- ARGV"
    )
    assert problems_in(good, "good.py", DOCS) == []


def test_github_slugs_and_duplicate_headings(tmp_path):
    assert github_slug("Waterlevel and transition test") == "waterlevel-and-transition-test"
    assert github_slug("Proxy and `TITO`, 4.1!") == "proxy-and-tito-41"
    page = "# A\n## Same\n```\n## Not a heading\n```\n## Same\n"
    assert section_slugs(page) == {"a", "same", "same-1"}
    (tmp_path / "p.md").write_text(page)
    ref = "docs" + "/p.md"  # built, so that the scan of this file does not see it
    assert problems_in(f"{ref}#same-1 {ref}#not-a-heading", "x.py", tmp_path) == [
        f"x.py:1: {ref} has no section #not-a-heading"
    ]


MARKDOWN_LINK = re.compile(r"\]\(([A-Za-z0-9_.-]+\.md)?(?:#([A-Za-z0-9_-]+))?\)")


def link_problems(page: Path, docs: Path) -> list[str]:
    """Broken relative links between docs pages: ``[text](other.md#section)`` or ``[text](#section)``."""
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for match in MARKDOWN_LINK.finditer(line):
            target = docs / (match.group(1) or page.name)
            if not target.is_file():
                found.append(f"{page.name}:{number}: {target.name} does not exist")
            elif match.group(2) and match.group(2) not in section_slugs(target.read_text(encoding="utf-8")):
                found.append(f"{page.name}:{number}: {target.name} has no section #{match.group(2)}")
    return found


def test_links_between_docs_pages_resolve(tmp_path):
    assert [p for page in sorted(DOCS.glob("*.md")) for p in link_problems(page, DOCS)] == []
    (tmp_path / "a.md").write_text("# A\n## Here\nsee [x](#here), [y](b.md#gone) and [z](c.md)\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert link_problems(tmp_path / "a.md", tmp_path) == [
        "a.md:3: b.md has no section #gone",
        "a.md:3: c.md does not exist",
    ]
