"""The part of a docs page between two marker lines, written by a generator.

Shared by hack/gen-*-reference.py: ``render`` puts a generator's text (the
marker lines included) in place of the page's generated part; ``main`` is
their command line: rewrite the page, or ``--check`` that it is current.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
END = "<!-- END GENERATED -->"


def render(page_path: Path, page: str, begin: str, generated: str) -> str:
    start, end = page.find(begin), page.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{page_path.relative_to(REPO)}: the marker lines are missing:\n{begin}\n{END}")
    return page[:start] + generated + page[end + len(END):]


def main(argv: list[str], page_path: Path, render_page: Callable[[str], str], *, source: str,
         script: str, usage: str) -> int:
    """Rewrite ``page_path`` with ``render_page``, or with ``--check`` exit 1
    (naming ``source`` and the command) when it is not current."""
    page = page_path.read_text()
    new = render_page(page)
    if argv[1:] == ["--check"]:
        if new != page:
            print(f"{page_path.relative_to(REPO)} is not current with {source}: run {script} (or make docs)",
                  file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(usage, file=sys.stderr)
        return 2
    if new != page:
        page_path.write_text(new)
    return 0
