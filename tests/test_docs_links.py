"""The documentation stands on its own: its links resolve, and nothing cites files outside the repo.

(a) Every relative link in README.md and docs/*.md names an existing file or folder, and a
    ``#anchor`` names a heading of the target (GitHub's heading ids).
(b) No file of the repository cites design documents that live outside it (the shared folder, its
    formats and architecture notes); the facts the code relies on are in docs/formats.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Written in pieces so that this file does not match its own patterns.
OUTSIDE_CITATIONS = re.compile(r"\.\./" + "shared" + r"|" + r"FORMATS\.md|" + r"ARCHITECTURE\.md")
_SKIPPED_DIRS = {".git", ".venv", ".venv-ci", "__pycache__", "node_modules", "output"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target); target may be <...> and may carry a "title".
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)"
)
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            continue
        lines.append((number, line))
    return lines


def _links(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose_lines(text):
        line = _INLINE_CODE.sub("", line)  # `[a](b)` in code is not a link
        targets = [m.group(1) for m in _INLINE_LINK.finditer(line)]
        targets += [m.group(1) for m in _REFERENCE_DEF.finditer(line)]
        found += [(number, target.strip("<>")) for target in targets]
    return found


def _slug(heading: str) -> str:
    """GitHub's id of a heading: markup removed, lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every id a link may name in ``path``: headings (with GitHub's -1, -2 for repeats)."""
    seen: dict[str, int] = {}
    anchors = set()
    text = path.read_text(encoding="utf-8")
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if match:
            slug = _slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    anchors.update(_HTML_ID.findall(text))
    return anchors


def _problem(source: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``source``) does not resolve, or None for fine or external."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None  # http:, https:, mailto: ... are not checked (tests run offline)
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / unquote(path_part)).resolve() if path_part else source
    if not resolved.exists():
        return "no such file"
    if ROOT not in resolved.parents and resolved != ROOT:
        return "points outside the repository"
    is_markdown = resolved.is_file() and resolved.suffix == ".md"
    if anchor and is_markdown and unquote(anchor).lower() not in _anchors(resolved):
        return f"no heading #{anchor} in {resolved.relative_to(ROOT).as_posix()}"
    return None


def broken_links() -> list[str]:
    broken = []
    for doc in _doc_files():
        for number, target in _links(doc.read_text(encoding="utf-8")):
            problem = _problem(doc, target)
            if problem:
                broken.append(f"{doc.relative_to(ROOT).as_posix()}:{number}: ({target}) {problem}")
    return broken


def test_every_relative_doc_link_resolves():
    assert broken_links() == []


def _repository_files() -> list[str]:
    """Tracked files and new files not ignored by git; a walk of the tree where git is missing."""
    try:
        result = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        files = [name for name in result.stdout.decode("utf-8").split("\0") if name]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if path.is_file() and not any(p in _SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
            found.append(path.relative_to(ROOT).as_posix())
    return found


def outside_citations() -> list[str]:
    hits = []
    for name in _repository_files():
        path = ROOT / name
        if name == THIS_FILE or not path.is_file():
            continue  # this test names the patterns; a deleted file is not in the tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE_CITATIONS.search(line):
                hits.append(f"{name}:{number}: {line.strip()}")
    return hits


def test_nothing_cites_documents_outside_the_repository():
    assert outside_citations() == []


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("How values from kohya files are read", "how-values-from-kohya-files-are-read"),
        ("[sampling]", "sampling"),
        ("Dataset keys ([[datasets]])", "dataset-keys-datasets"),
        ("LoRA files", "lora-files"),
        ("`network_weights` files", "network_weights-files"),
    ],
)
def test_heading_ids_follow_github(heading, slug):
    assert _slug(heading) == slug
