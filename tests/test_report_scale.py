"""The report of a run whose every client is its own group (hundreds of groups): bounded summary lines and plot, a
CSV of every client, the same Mean and intervals as computed directly, console tables that print whole; tables of
few groups as before."""

from __future__ import annotations

import csv
import importlib.util
import io
import statistics
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console
from rich.markdown import Markdown
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.report import group_table, read_records, render_latex, write_plots, write_summary
from fedpeft.report.intervals import paired_interval, t_interval
from fedpeft.report.tables import MAX_GROUP_COLUMNS, MEAN_COLUMN, group_spread, sample_sd
from fedpeft.report.terminal import fit_tables

_SPEC = importlib.util.spec_from_file_location(
    "report_scale", Path(__file__).parents[1] / "benchmarks" / "report_scale.py"
)
assert _SPEC is not None and _SPEC.loader is not None
report_scale = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report_scale)

CLIENTS = 300


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A run of 300 clients, each its own group, and its summary."""
    run = report_scale.write_client_run(tmp_path_factory.mktemp("run"), CLIENTS, seeds=3)
    out = tmp_path_factory.mktemp("report")
    text = write_summary([run], out)
    return run, out, text


def test_summary_of_many_groups_has_short_lines_and_no_column_per_client(many):
    run, _, text = many
    few = write_summary([report_scale.write_client_run(run.parent / "few", 4)], run.parent / "few-report")
    # As long as a report of 4 clients: the longest lines are the notes' paragraphs, not the tables.
    assert max(map(len, text.splitlines())) <= max(map(len, few.splitlines())) + 400
    tables = [line for line in text.splitlines() if line.startswith("| Method")]
    assert tables and max(line.count("|") for line in tables) <= 10
    assert "c00150" not in text.split("## Results")[1].split("### r = 2")[0]  # no client in a header
    assert "**Many groups** (Seen pool 300 clients)" in text
    assert "| Method | Mean | p10 | median | p90 | lowest client | highest client | Wins |" in text
    assert "(300 rows: min, median and max over them; every row in `data.json`)" in text  # the Data section
    assert len(text.splitlines()) < 200


def test_distribution_cells_are_the_group_values_quantiles(many):
    run, _, text = many
    results, _ = read_records([run])
    table = group_table(results, pool="seen", metric="accuracy", budget=8)
    assert table.summarized and len(table.groups) == CLIENTS > MAX_GROUP_COLUMNS
    per_client: dict[str, list[float]] = {}
    for r in results:
        if r["method"] == "lora" and r["budget"] == 8:
            per_client.setdefault(r["client"], []).append(r["value"])
    values = {client: statistics.fmean(found) for client, found in per_client.items()}
    deciles = statistics.quantiles(values.values(), n=10, method="inclusive")
    spread = group_spread(table, "lora")
    assert spread is not None
    assert spread.p10 == pytest.approx(deciles[0]) and spread.p90 == pytest.approx(deciles[8])
    assert spread.median == pytest.approx(statistics.median(values.values()))
    assert spread.lowest == min(values.items(), key=lambda item: item[1])
    assert spread.highest == max(values.items(), key=lambda item: item[1])
    name, value = spread.lowest
    assert f"| {statistics.median(values.values()) * 100:.2f} |" in text
    assert f" {name} {value * 100:.2f} |" in text


def test_mean_and_intervals_of_many_groups_are_computed_directly(many):
    run, _, text = many
    results, _ = read_records([run])
    table = group_table(results, pool="seen", metric="accuracy", budget=8)

    def rows(method, budget):
        return {(r["client"], r["seed"]): r["value"] for r in results if (r["method"], r["budget"]) == (method, budget)}

    lora, local = rows("lora", 8), rows("local", None)
    per_seed = [statistics.fmean(v for (_, s), v in lora.items() if s == seed) for seed in range(3)]
    cell = table.cells["lora", MEAN_COLUMN]
    assert cell.mean == pytest.approx(statistics.fmean(per_seed)) and cell.sd == statistics.stdev(per_seed)
    differences = [
        statistics.fmean(lora[client, seed] - local[client, seed] for seed in range(3))
        for client in {client for client, _ in lora}
    ]
    reference, interval = table.against["lora", MEAN_COLUMN]
    low, high = t_interval(differences)
    assert reference == "local" and interval.clients == CLIENTS and interval.pairs == 3 * CLIENTS
    assert (interval.mean, interval.low, interval.high) == pytest.approx((statistics.fmean(differences), low, high))
    assert interval == paired_interval(lora, local)
    assert f"| lora | **{cell.mean * 100:.2f} ± {cell.sd * 100:.2f}** |" in text  # bold: above local beyond 0
    # A group of one client has no interval: never bold, no Wins.
    assert table.wins == {"fedit": 0, "local": 0, "lora": 0}
    assert all(
        ("lora", client) not in table.against or table.against["lora", client][1].low is None for client in table.groups
    )


def test_clients_csv_holds_every_client(many):
    run, out, _ = many
    rows = list(csv.DictReader((out / "clients.csv").open()))
    assert len(rows) == CLIENTS * 5  # base, fedit, local, lora at two budgets
    lora = [row for row in rows if row["method"] == "lora" and row["budget"] == "8"]
    assert [row["client"] for row in lora] == [report_scale.client_id(i) for i in range(CLIENTS)]
    results, _ = read_records([run])
    values = [r["value"] for r in results if (r["method"], r["budget"], r["client"]) == ("lora", 8, "c00007")]
    row = lora[7]
    assert (row["group"], row["seeds"]) == ("c00007", "3")
    assert float(row["mean"]) == pytest.approx(statistics.fmean(values) * 100)
    assert float(row["sd"]) == pytest.approx(statistics.stdev(values) * 100)


def test_latex_of_many_groups_has_the_distribution_not_a_column_per_client(many):
    run, _, _ = many
    results, _ = read_records([run])
    latex = render_latex(results)
    assert "c00150" not in latex
    assert r"\begin{tabular}{lrrrrrrr}" in latex  # Method, Mean, p10, median, p90, lowest, highest, Wins
    assert "Over its 300 clients: 10th percentile, median, 90th percentile." in latex


def test_heatmap_of_many_groups_has_a_bounded_size(many, tmp_path):
    run, _, _ = many
    written = write_plots([run], tmp_path / "plots")
    heatmap = tmp_path / "plots" / "groups_seen_accuracy.png"
    assert heatmap in written
    width, height = Image.open(heatmap).size
    assert width <= 1200 and height <= 1200


def test_sample_sd_is_statistics_stdev():
    cases = [[0.61, 0.62, 0.6], [0.5, 0.5], [1e-300, 3e-300, 2e-300], [1e12, 1e12 + 1, -3.5], [0.1] * 7, [2, 3]]
    for values in cases:
        assert sample_sd(values) == statistics.stdev(values)


def _rendered(markdown: str, width: int) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(Markdown(markdown))
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 60, 100, 250])
def test_console_tables_print_whole_at_any_width(tmp_path, width):
    run = report_scale.write_client_run(tmp_path / "run", 16)  # 16 client columns: the widest per-group table
    text = write_summary([run], tmp_path / "out")
    fitted = fit_tables(text, width)
    lines = _rendered(fitted, width)
    assert not any("…" in line for line in lines)
    assert max(map(len, lines)) <= width
    # Every cell of a narrowed per-group table prints whole, on its row's one line (no cell squeezed blank).
    table = fitted.split("### r = 8 — Accuracy")[1].split("\n\n")[1].splitlines()
    assert table[0].startswith("| Method |") and "| Mean |" in table[0] and "Wins" in table[0]
    row = [cell.strip().replace("**", "") for cell in table[-1].strip("|").split("|")]
    assert row[0] == "lora"
    printed = [line for line in lines if line.split()[:1] == ["lora"] and row[-2] in line]
    assert printed and all(cell in printed[-1] for cell in row)
    assert "columns left out to fit" in fitted  # 16 columns of `12.34 ± 1.23` do not fit even 250
    if width >= 60:  # a table that fits is as it was
        assert "| Method | r = 2 | r = 8 | no budget |" in fitted


def test_cli_report_prints_no_cut_cells_at_a_narrow_terminal(tmp_path):
    run = report_scale.write_client_run(tmp_path / "run", 40)
    result = CliRunner().invoke(
        app,
        ["report", str(run), "--out", str(tmp_path / "out"), "--no-plots", "-v"],
        env={"COLUMNS": "60"},
        terminal_width=60,
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert "lowest client" in result.output or "columns left out to fit 60 columns" in result.output
    assert (tmp_path / "out" / "clients.csv").is_file()


def test_cli_report_ends_as_a_run_does_and_prints_the_whole_summary_with_verbose(tmp_path):
    run = report_scale.write_client_run(tmp_path / "run", 40)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Highest mean Accuracy, seen pool")
    assert "Gain over base: Seen pool — Accuracy" in lines
    assert lines[-2:] == [f"Summary (data, every table, costs): {out / 'summary.md'}", f"Outputs written to {out}"]
    assert "## Data" not in result.stdout and "Costs" not in result.stdout and len(lines) < 30
    whole = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--no-plots", "--verbose"])
    assert whole.exit_code == 0, whole.output
    assert "fedpeft results: run" in whole.stdout and whole.stdout.count("\n") > 100
    assert whole.stdout.splitlines()[-1] == f"Outputs written to {out}"


def test_few_groups_print_as_before(tmp_path):
    run = report_scale.write_client_run(tmp_path / "run", MAX_GROUP_COLUMNS)
    text = write_summary([run], tmp_path / "out")
    assert "| Method | c00000 | c00001 |" in text and "Many groups" not in text
    assert not (tmp_path / "out" / "clients.csv").exists()
