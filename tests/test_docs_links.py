"""The README and docs/ link only to what exists: every relative `[text](path)` names a file or
folder of the repository, every `#anchor` a heading of the page it points into (GitHub's
anchors), and docs/README.md, the index, lists every page of docs/."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCED = re.compile(r"^(`{3,}).*?^\1\s*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The page without code: links and headings inside code blocks and spans are not ones."""
    return CODE_SPAN.sub("", FENCED.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's anchor for each heading: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCED.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_anchor_rule_is_githubs():
    page = REPO / "docs" / "designer.md"
    assert {"a-separate-designer-the-designer-table",
            "one-round-with-the-coder-coder-cputoml"} <= anchors(page)


def test_the_index_lists_every_page():
    listed = {Path(target).name for target in links(REPO / "docs" / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}"
