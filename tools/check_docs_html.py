"""Fail when reST markup leaks into the built documentation.

Usage: `python tools/check_docs_html.py SITE_DIR [--pending FILE]` (after `mkdocs build`;
`make docs` runs it).

Docstrings are rendered as Markdown (Google style), so a reST role such as
":class:`Foo`" shows up raw, and a paragraph ending in "::" (a reST literal-block marker)
keeps both colons. This walks every HTML page, looks only at text outside `<code>`, `<pre>`,
`<script>` and `<style>` (C++ `std::` inside code is fine), and reports each leak with the
page and a snippet. Exit status 1 when anything leaked, 0 otherwise.

`--pending FILE` names pages (one path relative to SITE_DIR a line, `#` comments) whose
modules' docstrings are still being converted: their leaks are counted and reported but do
not fail the check. A listed page with no leaks left is reported so that it is taken off
the list; an empty list makes the check strict everywhere.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

ROLE_RE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|exc|mod|data|obj|const|type|ref|doc):(?:`|$)"
)
# "::" closing a text run (a paragraph or the text before a tag), not ":::" or "a::b"
LITERAL_RE = re.compile(r"(?<!:)::\s*$")
_SKIP = {"code", "pre", "script", "style", "kbd", "samp"}


@dataclass(frozen=True)
class Leak:
    """One piece of raw reST in a page."""

    page: str
    kind: str
    snippet: str

    def __str__(self) -> str:
        return f"{self.page}: {self.kind}: ...{' '.join(self.snippet.split())}"


class _TextRuns(HTMLParser):
    """Collects runs of text outside code-like elements (a run ends at any tag)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.runs: list[str] = []
        self._run: list[str] = []

    def _flush(self) -> None:
        if self._run:
            self.runs.append("".join(self._run))
            self._run = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._flush()
        if tag in _SKIP:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        self._flush()
        if tag in _SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self._run.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def find_leaks(html: str, page: str = "<html>") -> list[Leak]:
    """Every raw reST role and literal-block marker in the text of `html`."""
    parser = _TextRuns()
    parser.feed(html)
    parser.close()
    leaks: list[Leak] = []
    for run in parser.runs:
        leaks.extend(
            Leak(page, "reST role", run[max(0, m.start() - 50) : m.end()].strip())
            for m in ROLE_RE.finditer(run)
        )
        m2 = LITERAL_RE.search(run)
        if m2:
            leaks.append(
                Leak(page, "reST literal-block marker '::'", run[-60:].strip().replace("\n", " "))
            )
    return leaks


def check_site(site: Path) -> list[Leak]:
    """The leaks of every `*.html` page under `site`."""
    leaks: list[Leak] = []
    for page in sorted(site.rglob("*.html")):
        leaks.extend(find_leaks(page.read_text(encoding="utf-8"), str(page.relative_to(site))))
    return leaks


def read_pending(path: Path) -> set[str]:
    """The page paths listed in a pending file (blank lines and `#` comments skipped)."""
    pages = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pages.add(line)
    return pages


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Fail when reST markup leaks into built docs.")
    ap.add_argument("site", type=Path, help="the directory mkdocs built")
    ap.add_argument("--pending", type=Path, help="pages whose leaks are reported, not failed")
    args = ap.parse_args(argv)
    site: Path = args.site
    if not site.is_dir() or not any(site.rglob("*.html")):
        print(f"{site}: no built HTML here; run mkdocs build first", file=sys.stderr)
        return 2
    pending = read_pending(args.pending) if args.pending else set()
    leaks = check_site(site)
    failing = [leak for leak in leaks if leak.page not in pending]
    tolerated = [leak for leak in leaks if leak.page in pending]
    for leak in failing:
        print(leak)
    if tolerated:
        pages = sorted({leak.page for leak in tolerated})
        print(
            f"docs check: {len(tolerated)} raw reST piece(s) on {len(pages)} pending page(s), "
            "not failed"
        )
        print(f"  pending in {args.pending}: {', '.join(pages)}")
    done = sorted(pending - {leak.page for leak in leaks})
    if done:
        print(f"docs check: no raw reST left on {', '.join(done)}: take them off {args.pending}")
    if failing:
        print(
            f"{len(failing)} piece(s) of raw reST in the built docs: write docstrings in "
            "Markdown (`Name` instead of :class:`Name`, a fenced block instead of '::')",
            file=sys.stderr,
        )
        return 1
    n_pages = sum(1 for _ in site.rglob("*.html"))
    print(f"docs check: no raw reST on {n_pages - len(pending & {lk.page for lk in leaks})} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
