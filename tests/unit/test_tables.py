from __future__ import annotations

import pytest

from stalledpolicy.tables import (
    display_width,
    format_age,
    printable,
    render_pairs,
    render_table,
    truncate,
    truncate_unescaped,
)


def test_printable_makes_one_safe_line():
    assert printable(None) == "-"
    assert printable(42) == "42"
    assert printable("boom\n  at worker.ex:12\r\n") == "boom at worker.ex:12"
    # an ANSI colour sequence from a worker's error must not reach the terminal raw
    assert printable("\x1b[31mred") == "\\x1b[31mred"
    assert "\x1b" not in printable("a\x1b]0;title\x07b")


def test_bytes_that_were_not_utf8_are_shown_as_the_bytes():
    # what surrogateescape makes of b"JOB\xff1" and b"\xc3(": one escape per byte
    assert printable(b"JOB\xff1".decode("utf-8", "surrogateescape")) == "JOB\\xff1"
    assert printable(b"\xc3(".decode("utf-8", "surrogateescape")) == "\\xc3("
    assert printable("\ud800") == "\\ud800"  # another lone surrogate: still escaped
    printable(b"a\xfeb".decode("utf-8", "surrogateescape")).encode("utf-8")  # printable to any terminal


def test_truncate_marks_the_cut_and_respects_width():
    assert truncate("short", 10) == "short"
    assert truncate("exactly10!", 10) == "exactly10!"
    cut = truncate("a much longer error message", 10)
    assert cut == "a much lo…"
    assert display_width(cut) == 10
    assert truncate("anything", 0) == ""


def test_truncate_unescaped_measures_the_text_as_a_cell_shows_it():
    state = "\x1b[31mred\x1b[0m-and-then-some"
    cut = truncate_unescaped(state, 16)
    assert display_width(printable(cut)) <= 16
    assert printable(cut) == "\\x1b[31mred\\x1b…"
    assert display_width(printable(truncate(state, 16))) > 16  # what the marker used to hold
    assert truncate_unescaped("pending", 16) == "pending"
    assert truncate_unescaped("a\\b", 3) == "a…"  # shown a\\b: 4 columns
    assert truncate_unescaped("anything", 0) == ""
    assert display_width(printable(truncate_unescaped("\x1c" * 40, 16))) <= 16  # escaped: 4 columns each


def test_wide_characters_count_two_columns():
    assert display_width("日本") == 4
    assert display_width("e\u0301") == 1  # combining accent takes no column
    assert display_width(truncate("日本語のエラー", 5)) <= 5


def test_table_columns_are_aligned_and_numbers_right_aligned():
    text = render_table(
        ("ID", "LANE", "STALLED", "LAST ERROR"),
        [("JOB1", "tenant-a", 3, "stalled"), ("JOB1234567", None, 12, None), ("JOB2", "日本", 1, "x")],
        right=("STALLED",),
    )
    lines = text.splitlines()
    assert len(lines) == 4
    header = lines[0]
    lane_col = header.index("LANE")
    err_col = header.index("LAST ERROR")
    assert lines[1][lane_col:].startswith("tenant-a")
    assert lines[2][lane_col:].startswith("-")
    assert lines[1][err_col:] == "stalled"
    # right alignment: numbers end where the header ends
    stalled_end = header.index("STALLED") + len("STALLED")
    assert lines[1][:stalled_end].endswith(" 3")
    assert lines[2][:stalled_end].endswith("12")
    # the wide lane pads by display width, so the next column still lines up
    assert display_width(lines[3][: lines[3].index("x")]) == err_col
    assert all(line == line.rstrip() for line in lines)


def test_table_caps_a_column_and_refuses_ragged_rows():
    text = render_table(("ID", "ERR"), [("J", "e" * 100)], max_widths={"ERR": 12})
    assert text.splitlines()[1].endswith("e" * 11 + "…")
    with pytest.raises(ValueError, match="2 columns"):
        render_table(("A", "B"), [("only one",)])


def test_pairs_align_values():
    lines = render_pairs([("queue", "orders"), ("dead jobs", 7)]).splitlines()
    assert lines[0].index("orders") == lines[1].index("7")


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s ago"),
        (59.9, "59s ago"),
        (60, "1m0s ago"),
        (3 * 3600 + 12 * 60 + 5, "3h12m ago"),
        (2 * 86400 + 5 * 3600 + 59, "2d5h ago"),
        (-2, "0s ago"),
        (None, "-"),
    ],
)
def test_format_age(seconds, expected):
    assert format_age(seconds) == expected


def test_a_backslash_is_shown_doubled_so_escapes_are_never_ambiguous():
    raw_byte = b"JOB\xff".decode("utf-8", "surrogateescape")
    literal = "JOB\\xff"
    assert printable(raw_byte) == "JOB\\xff"
    assert printable(literal) == "JOB\\\\xff"
    assert printable(raw_byte) != printable(literal)


def test_an_exact_cell_keeps_every_character_told_apart():
    """Ids and lanes: what is shown must name one value (and be typeable with
    the shell's escapes), so whitespace is not collapsed, trimmed or hidden."""
    assert printable("a\tb", exact=True) == "a\\x09b"
    assert printable("a\nb", exact=True) == "a\\x0ab"
    assert printable("a  b", exact=True) == "a  b"
    assert printable("a\u00a0b", exact=True) == "a\\u00a0b"  # a no-break space is not a space
    assert printable("a\u0085b", exact=True) == "a\\u0085b"  # nor the byte 0x85 (\\x85)
    assert printable("a\u2028b", exact=True) == "a\\u2028b"
    assert printable("JOB\\x01", exact=True) == "JOB\\\\x01"
    assert printable(None, exact=True) == "-"


def test_exact_columns_of_a_table():
    table = render_table(("ID", "LAST ERROR"), [("a\tb", "x\ty")], exact=("ID",))
    assert table.splitlines()[1] == "a\\x09b  x y"


def test_an_exact_value_that_reads_as_the_empty_cell_is_escaped():
    assert printable("-", exact=True) == "\\x2d"  # a lane named '-' is not "no lane"
    assert printable(None, exact=True) == printable(None) == "-"
    assert printable("-") == "-"
