"""The part of a docs page between two marker lines, written by a generator.

Shared by hack/gen-*-reference.py: ``render`` puts a generator's text (the
marker lines included) in place of the page's generated part; ``main`` is
their command line: rewrite the page, or ``--check`` that it is current.
hack/gen-crd.py writes whole files with ``write_or_check``, the same command line.
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
    return write_or_check(argv, {page_path: render_page(page_path.read_text())}, source=source,
                          command=f"{script} (or make docs)", usage=usage)


def write_or_check(argv: list[str], files: dict[Path, str], *, source: str, command: str, usage: str) -> int:
    """Write each file's text where it differs, or with ``--check`` exit 1
    (naming the stale files, ``source`` and ``command``) when one differs."""
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    if argv[1:] == ["--check"]:
        for path in stale:
            print(f"{path.relative_to(REPO)} is not current with {source}: run {command}", file=sys.stderr)
        return 1 if stale else 0
    if argv[1:]:
        print(usage, file=sys.stderr)
        return 2
    for path in stale:
        path.write_text(files[path])
    return 0
