"""What the commands print of a summary: the end of ``fedpeft run`` and ``fedpeft report``, the head of its
``summary.md`` as plain text within 100 columns (its headline paragraphs and gain tables), read back from the written
summary; and ``fedpeft report -v``'s markdown with every table narrowed to the terminal's width (:func:`fit_tables`).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

END_BLOCK_WIDTH = 100
LEAD_SECTION = "Headline"
# Columns a narrowed table keeps first, after its first: what a per-group table's reader looks for.
KEY_COLUMNS = ("Mean", "Wins", "Wins (n.s.)")
GAIN_SECTION = "Gain over base"


@dataclass
class MarkdownBlock:
    """A table or a paragraph of a markdown text, with the ``##`` section and ``###`` heading it is under; a
    table's ``rows`` start with its header (cells without ``**`` and backticks)."""

    section: str
    heading: str
    rows: list[list[str]] = field(default_factory=list)
    text: str = ""


def run_end_block(target: Path, *, every_table: bool = False, width: int = END_BLOCK_WIDTH) -> list[str]:
    """What ``fedpeft run`` and ``fedpeft report`` print when they end, before the line naming ``target``: what the
    ``summary.md`` in ``target`` puts first (its headline paragraphs and the gain over the base model of its first
    metric per pool; ``every_table``: of every metric), within ``width`` columns, and the summary's path.

    A table too wide for ``width`` is printed in several parts, each repeating its first column, so that no cell
    is cut. Without a gain section, the summary's first result table stands in for it.
    """
    summary = target / "summary.md"
    if not summary.is_file():
        return []
    blocks = markdown_blocks(summary.read_text())
    lines = []
    for block in blocks:
        if block.section == LEAD_SECTION and block.text:
            lines += [*_wrapped(block.text, width), ""]
    tables = [b for b in blocks if b.rows and b.section == GAIN_SECTION]
    if not every_table:  # the first of each pool's tables (headed "<pool> — <metric>")
        pools: set[str] = set()
        firsts = []
        for table in tables:
            pool = table.heading.split(" — ")[0]
            if pool not in pools:
                pools.add(pool)
                firsts.append(table)
        tables = firsts
    if not tables:
        tables = [b for b in blocks if b.rows and b.section != "Data"][:1]
    for table in tables:
        lines.append(f"{table.section}: {table.heading}" if table.heading else table.section)
        lines += [*text_table(table.rows, width), ""]
    return [*lines, f"Summary (data, every table, costs): {summary}"]


def markdown_blocks(text: str) -> list[MarkdownBlock]:
    """The tables and paragraphs (a list is one paragraph) of a markdown text, headings left out."""
    blocks: list[MarkdownBlock] = []
    section = heading = ""
    rows: list[list[str]] = []
    paragraph: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [_plain(cell.strip()).replace("\\|", "|") for cell in _cells(line)]
            if not all(set(cell) <= set("-: ") for cell in cells):  # not the |---| line under the header
                rows.append(cells)
            continue
        if rows:
            blocks.append(MarkdownBlock(section, heading, rows=rows))
            rows = []
        if line.strip() and not line.startswith("#"):
            paragraph.append(line)
            continue
        if paragraph:
            blocks.append(MarkdownBlock(section, heading, text="\n".join(paragraph)))
            paragraph = []
        if line.startswith("## "):
            section, heading = line[3:].strip(), ""
        elif line.startswith("### "):
            heading = line[4:].strip()
    return blocks


def _plain(text: str) -> str:
    return text.replace("**", "").replace("`", "")


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:]
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return re.split(r"(?<!\\)\|", inner)


def _wrapped(text: str, width: int) -> list[str]:
    """A markdown paragraph as plain lines of at most ``width`` columns; list items keep their own lines."""
    items: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith(("- ", "* ")) or not items:
            items.append(line.strip())
        else:
            items[-1] += " " + line.strip()
    lines = []
    for item in items:
        indent = "  " if item.startswith(("- ", "* ")) else ""
        lines += textwrap.wrap(_plain(item), width, subsequent_indent=indent, break_on_hyphens=False)
    return lines


def text_table(rows: list[list[str]], width: int = END_BLOCK_WIDTH) -> list[str]:
    """``rows`` (the header first) as aligned plain text: the first column left-aligned, the others right-aligned,
    a rule under the header; split into parts of columns that each fit ``width`` (repeating the first column)."""
    if not rows:
        return []
    columns = max(len(row) for row in rows)
    rows = [row + [""] * (columns - len(row)) for row in rows]
    widths = [max(len(row[k]) for row in rows) for k in range(columns)]
    parts: list[list[int]] = [[]]
    used = widths[0]
    for k in range(1, columns):
        if parts[-1] and used + 2 + widths[k] > width:
            parts.append([])
            used = widths[0]
        parts[-1].append(k)
        used += 2 + widths[k]
    lines: list[str] = []
    for index, part in enumerate(parts):
        if index:
            lines.append("")
        for number, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), *(row[k].rjust(widths[k]) for k in part)]
            lines.append("  ".join(cells).rstrip())
            if number == 0:
                lines.append("  ".join("-" * widths[k] for k in [0, *part]))
    return lines


def rendered_width(widths: list[int]) -> int:
    """The width of a table of columns ``widths`` (their longest cells) as rich draws a markdown table: each column
    and its two spaces."""
    return sum(widths) + 2 * len(widths)


def fit_tables(text: str, width: int) -> str:
    """``text`` (markdown) with each table too wide for ``width`` columns narrowed by leaving columns out, so that
    it prints whole: no cell cut to ``…`` or squeezed blank. A narrowed table keeps its first column, then ``Mean``
    and Wins, then the others from the left while they fit, and is followed by one line naming the columns left
    out. Tables that fit are left as they are."""
    lines = text.split("\n")
    found: list[str] = []
    table: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            found += _fitted(table, width)
            table = []
        found.append(line)
    return "\n".join(found[:-1])


def _fitted(table: list[str], width: int) -> list[str]:
    rows = [_cells(line) for line in table]
    columns = len(rows[0])
    if any(len(row) != columns for row in rows):
        return table  # not a table this function understands: as it is
    widths = [
        max(len(_plain(row[k].strip()).replace("\\|", "|")) for row in rows if not _rule(row)) for k in range(columns)
    ]
    if rendered_width(widths) <= width:
        return table
    header = [cell.strip() for cell in rows[0]]
    order = [0, *(k for k in range(1, columns) if header[k] in KEY_COLUMNS)]
    order += [k for k in range(1, columns) if k not in order]
    kept: list[int] = []
    for k in order:
        if not kept or rendered_width([widths[j] for j in [*kept, k]]) <= width:
            kept.append(k)
    kept.sort()
    left_out = [header[k] for k in range(columns) if k not in kept]
    narrowed = ["|" + "|".join(row[k] for k in kept) + "|" for row in rows]
    names = ", ".join(left_out)
    note = f"*{len(left_out)} of {columns} columns left out to fit {width} columns ({names}); summary.md has them.*"
    return [*narrowed, "", note]


def _rule(row: list[str]) -> bool:
    return all(set(cell.strip()) <= set("-:") for cell in row)
