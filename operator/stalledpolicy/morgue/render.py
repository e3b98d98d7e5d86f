"""Formatting shared by every morgue action: JSON documents, counts, times,
lanes and id lists, each made safe to print (``tables.printable``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO

from stalledpolicy import tables

# ids printed in a table-mode preview before "... and N more"
PREVIEW_IDS = 20
# table columns that name a job or a lane: shown exactly (tables.printable(exact=True))
EXACT_COLUMNS = ("ID", "LANE")
# the LANE cell of entries whose row is missing or not a hash: in no lane, flat
# included (engine.lane_of), so never counted under the flat lane's `-`
NO_LANE_CELL = "[in no lane: row missing or not a hash]"


def emit_json(document: dict, out: IO[str]) -> None:
    out.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def jobs_phrase(count: int) -> str:
    """``1 job``, ``3 jobs``."""
    return f"{count} job" if count == 1 else f"{count} jobs"


def iso_time(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def age_seconds(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def lane_label(lane: str | None) -> str:
    """A lane in a message (a table cell takes :func:`lane_cell`: the table
    makes every cell printable, and escaping twice would double backslashes)."""
    return tables.printable(lane_cell(lane), exact=True)


def lane_cell(lane: str | None) -> str | None:
    """None (shown ``-``) for no lane; a lane named ``-`` is shown escaped."""
    return lane or None


def lane_rows(lanes: dict[str | None, int]) -> list[tuple[str | None, int]]:
    """Lane table rows, the largest lane first; the None key (entries in no
    lane, ``engine.lane_of``) last, under :data:`NO_LANE_CELL`."""
    rows: list[tuple[str | None, int]] = [
        (lane_cell(name), count)
        for name, count in sorted(((n, c) for n, c in lanes.items() if n is not None),
                                  key=lambda kv: (-kv[1], kv[0]))
    ]
    if lanes.get(None):
        rows.append((NO_LANE_CELL, lanes[None]))
    return rows


def ids_preview(ids: Sequence[str]) -> str:
    shown = ", ".join(tables.printable(i, exact=True) for i in ids[:PREVIEW_IDS])
    more = len(ids) - PREVIEW_IDS
    return shown + (f", ... and {more} more (-o json lists all)" if more > 0 else "")
