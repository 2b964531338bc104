"""Every relative link of README.md and docs/*.md resolves: the file exists and its #anchor names a heading.

Anchors are GitHub's: a heading's text as rendered (code spans, links and emphasis reduced to their text),
lowercased, with every character that is not a letter, digit, space, hyphen or underscore removed and each
space made a hyphen; a repeated slug gets `-1`, `-2`, ... in order of appearance.
"""

from __future__ import annotations

import pathlib
import re
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def _prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's markdown text (before de-duplication)."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = LINK.sub(lambda m: m.group(1), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders no text of its own
    text = re.sub(r"[*~]|(?<!\w)_+|_+(?!\w)", "", text)  # emphasis markers (an underscore inside a word stays)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> Set[str]:
    text = page.read_text(encoding="utf-8")
    seen: Dict[str, int] = {}
    found: Set[str] = set()
    for _, line in _prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: pathlib.Path) -> Iterator[Tuple[int, str]]:
    """(line, target) of every link and image outside code, as written."""
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)):
            yield number, match.group(2)


def broken(page: pathlib.Path, root: pathlib.Path = ROOT) -> List[str]:
    """What in `page` does not resolve, one line per link (paths shown relative to `root`)."""
    found = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            found.append(f"{where}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            found.append(f"{where}: no heading with this anchor in {dest.relative_to(root)}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == []


def test_the_check_sees_links_anchors_and_breakage(tmp_path):
    """The checker itself: GitHub's slugs, duplicates, code left alone, a missing file and anchor caught."""
    assert slug("In `model.fit()`: `GradientLogger`") == "in-modelfit-gradientlogger"
    assert slug("Where it broke: forward, loss or backward") == "where-it-broke-forward-loss-or-backward"
    assert slug("The `first_nonfinite` record, *once*") == "the-first_nonfinite-record-once"
    assert slug("Speed & the [kernel](x.md)") == "speed--the-kernel"
    (tmp_path / "b.md").write_text("# Top\n\n## Part\n\n## Part\n\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#part-1) [ok](b.md#top) [self](#here) ![img](b.md)\n"
        "`[code](missing.md)` [web](https://example.com/x#y)\n"
        "```\n[fenced](missing.md)\n```\n"
        "## Here\n[bad](b.md#not-a-heading) [gone](c.md) [late](b.md#not-a-heading-1)\n"
    )
    assert anchors(tmp_path / "b.md") == {"top", "part", "part-1"}
    assert broken(page, root=tmp_path) == [
        "a.md:7: b.md#not-a-heading: no heading with this anchor in b.md",
        "a.md:7: c.md: no such file",
        "a.md:7: b.md#not-a-heading-1: no heading with this anchor in b.md",
    ]
