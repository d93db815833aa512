"""Each test file's seconds in a full run, which tests/conftest.py uses to hand out the longest files first.

Rewrite tests/file_seconds.json from a run of the README's test command with ``--durations=0``::

    python -m pytest -q -n 2 --dist loadfile --durations=0 -p no:cacheprovider > durations.log
    python tests/file_seconds.py durations.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
LINE = re.compile(r"([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def file_seconds(log: str) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests) from pytest's ``--durations=0`` lines."""
    seconds: Counter[str] = Counter()
    for line in log.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return {name: round(value, 1) for name, value in sorted(seconds.items(), key=lambda item: -item[1])}


if __name__ == "__main__":
    table = file_seconds(Path(sys.argv[1]).read_text())
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(table)} files, {sum(table.values()):.0f} s in all -> {TABLE}")
