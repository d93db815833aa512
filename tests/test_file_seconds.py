"""The table of each test file's seconds that orders the suite (tests/file_seconds.py)."""

from __future__ import annotations

import json

from tests.file_seconds import TABLE, file_seconds

DURATIONS = """\
============================= slowest durations ==============================
12.50s call     tests/test_b.py::test_one[x-1]
2.00s setup    tests/test_b.py::test_one[x-1]
0.25s teardown tests/test_a.py::test_two
30.00s call     tests/test_c.py::Case::test_three
0.25s call     tests/test_a.py::test_four
(5617 durations < 0.005s hidden.  Use -vv to show these durations.)
2381 passed, 488 warnings in 1527.13s (0:25:27)
"""


def test_seconds_add_up_per_file_longest_first():
    assert list(file_seconds(DURATIONS).items()) == [
        ("tests/test_c.py", 30.0),
        ("tests/test_b.py", 14.5),
        ("tests/test_a.py", 0.5),
    ]


def test_the_table_names_test_files_that_exist():
    table = json.loads(TABLE.read_text())
    assert table and all((TABLE.parent.parent / name).is_file() for name in table), sorted(table)
