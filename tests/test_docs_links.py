"""The documentation's links: every relative link in the README, docs/ and the node help pages reaches a file, and
every `#anchor` a heading of its page (GitHub's slugs); the README stays short and links every docs/ page."""

import glob
import os
import re
from urllib.parse import unquote

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
PAGES = [README] + DOCS + sorted(glob.glob(os.path.join(ROOT, "web", "docs", "*.md")))
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http(s)://, mailto:, ...


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def links(path: str):
    """(line number, target) of every markdown link and image outside code."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        line = INLINE_CODE.sub("", line)
        for match in LINK.finditer(line):
            yield number, match.group(1)
        match = REFERENCE.match(line)
        if match:
            yield number, match.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets, emphasis and backticks gone), lowercased, every
    character but letters, digits, `_`, `-` and spaces dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen: dict = {}
    found = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")  # GitHub numbers repeated headings
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))  # explicit HTML anchors
    return found


def problems(path: str) -> list:
    """What is wrong with the relative links of one markdown file."""
    found = []
    where = os.path.relpath(path, ROOT)
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), unquote(file_part))) if file_part else path
        if not os.path.exists(resolved):
            found.append(f"{where}:{number}: {target}: no such file ({os.path.relpath(resolved, ROOT)})")
            continue
        if anchor:
            if not resolved.endswith(".md") or os.path.isdir(resolved):
                found.append(f"{where}:{number}: {target}: an anchor into a file that is not markdown")
            elif unquote(anchor).lower() not in anchors(resolved):
                found.append(f"{where}:{number}: {target}: no heading '#{anchor}' in {os.path.relpath(resolved, ROOT)}")
    return found


def test_the_slugs_are_githubs():
    assert slug("Quality, measured on trained test beds") == "quality-measured-on-trained-test-beds"
    assert slug("Several GPUs: the parallel plan") == "several-gpus-the-parallel-plan"
    assert slug("Wan2.2 Cache-DiT for ComfyUI (`wan22-cachedit`)") == "wan22-cache-dit-for-comfyui-wan22-cachedit"
    assert slug("Boundary & Flow Shift") == "boundary--flow-shift"
    assert slug("The **bold** [link](x.md) and `code_name`") == "the-bold-link-and-code_name"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A part: with `code`\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md) [ok](other.md#a-part-with-code) [ok](#page) [web](https://x.org/a)\n"
                    "[gone](missing.md) [bad](other.md#no-such-part) [bad](#nothing)\n"
                    "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n", encoding="utf-8")
    found = problems(str(page))
    assert len(found) == 3, found
    assert "missing.md" in found[0] and "#no-such-part" in found[1] and "#nothing" in found[2]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_reaches_a_file_and_a_heading(path):
    assert problems(path) == []


def test_the_readme_is_short():
    with open(README, encoding="utf-8") as f:
        count = len(f.read().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines; move the depth into docs/"


def test_the_readme_links_every_docs_page():
    assert DOCS
    linked = {os.path.normpath(os.path.join(ROOT, unquote(target.partition("#")[0])))
              for _, target in links(README) if not EXTERNAL.match(target)}
    assert [os.path.relpath(p, ROOT) for p in DOCS if p not in linked] == []
