"""The report on thin evidence (one seed, few test examples per client), the headline first, LaTeX that fits a page,
legible heatmaps, and `fedpeft report` without torch."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import CLIENTS, classification_records, result, write_run

from fedpeft.report import read_records, render_csv, render_latex, write_plots, write_summary
from fedpeft.report.evidence import (
    FEW_TEST_EXAMPLES,
    MIN_TEST_EXAMPLES,
    ONE_SEED,
    SHARED_BASE_NOTE,
    evidence_note,
    judged_tables,
    per_client_test_examples,
    shared_base_note,
)


def data_json(run_dir: Path, test_per_client: float, *, unseen: float | None = None) -> Path:
    """A data.json as fedpeft.runner.data_overview writes it: groups en and fr, two seen clients each."""
    groups = {}
    for group in ("en", "fr"):
        row: dict = {"seen clients": 2, "seen train/client": 2.0, "seen test/client": test_per_client}
        if unseen is not None:
            row |= {"unseen clients": 1, "unseen test/client": unseen}
        groups[group] = row
    (run_dir / "data.json").write_text(json.dumps({"dataset": "files", "task": "classification", "groups": groups}))
    return run_dir


def one_seed_run(tmp_path: Path, test_per_client: float = 1.0) -> Path:
    """The README's own-data example in spirit: one seed, few test rows per client, lora far below base."""
    records = [result("base", None, client, 0, 1.0) for client in CLIENTS]
    records += [result("lora", 4, client, 0, 1 / 3) for client in CLIENTS]
    records += [result("fedit", 4, client, 0, 0.5) for client in CLIENTS]
    return data_json(write_run(tmp_path / "run", records), test_per_client)


def two_seed_run(tmp_path: Path) -> Path:
    records = [r for r in classification_records() if r["budget"] != 4]  # r = 4 has one seed
    return data_json(write_run(tmp_path / "run", records), 40.0)


# ---------------------------------------------------------------------------------------------- what is thin


def test_per_client_test_examples_from_data_json(tmp_path):
    first = data_json(write_run(tmp_path / "a", []), 10.0, unseen=40.0)
    assert per_client_test_examples([first]) == {"seen": 10.0, "unseen": 40.0, "all": 20.0}
    second = data_json(write_run(tmp_path / "b", []), 50.0)
    assert per_client_test_examples([first, second])["seen"] == 10.0  # the smallest over the runs
    bare = write_run(tmp_path / "bare", [])  # no data.json: the report cannot tell, so it does not judge
    assert per_client_test_examples([bare]) == {}


def test_tables_are_thin_on_one_seed_or_few_test_examples(tmp_path):
    results, _ = read_records([two_seed_run(tmp_path)])
    assert [t.thin for t in judged_tables(results, {"seen": 40.0})] == [()]
    assert [t.thin for t in judged_tables(results, {"seen": 29.0})] == [(FEW_TEST_EXAMPLES,)]
    results, _ = read_records([one_seed_run(tmp_path / "one")])
    assert [t.thin for t in judged_tables(results, {"seen": 1.0})] == [(ONE_SEED, FEW_TEST_EXAMPLES)]
    assert [t.thin for t in judged_tables(results)] == [(ONE_SEED,)]


def test_the_note_names_the_tables_of_one_seed(tmp_path):
    results = classification_records()  # r = 2: two seeds, r = 4: lora on one seed
    tables = judged_tables(results)
    assert [t.thin for t in tables] == [(), (ONE_SEED,)]
    note = evidence_note(tables)
    assert (
        "- one seed (in Seen pool, r = 4): no spread over seeds. Over that seed's clients the 95 % intervals support "
        "r = 4: lora minus base +40.00 [+40.00, +40.00] (n = 4); the seed's own draw, which moves every client "
        "together, is not in these intervals." in note
    )
    assert evidence_note(judged_tables([r for r in results if r["budget"] != 4])) == ""


# ---------------------------------------------------------------------------------------------- summary.md


def test_summary_on_thin_evidence_leads_with_the_headline_and_marks_no_winner(tmp_path):
    text = write_summary([one_seed_run(tmp_path)], tmp_path / "out")
    headline = text.split("## Headline\n\n")[1].split("\n## ")[0]
    assert headline.startswith(
        "**Highest mean Accuracy, seen pool** (x100, mean over the pool's clients, one seed): "
        "r = 4: no method above base (best: fedit 50.00 vs base 100.00, -50.00).\n\n"
    )
    note = (
        "**Evidence: too little to call a winner.** These results rest on\n\n"
        "- one seed: no spread over seeds. Over that seed's clients the 95 % intervals support r = 4: fedit minus "
        "lora +16.67 [+16.67, +16.67] (n = 4), minus base -50.00 [-50.00, -50.00] (n = 4); the seed's "
        "own draw, which moves every client together, is not in these intervals;\n"
        f"- fewer than {MIN_TEST_EXAMPLES} test examples per client on average (Seen pool 1): one test example moves "
        "a client's score by about 100 points.\n\n"
        "Those tables keep the numbers but mark no cell bold and head the Wins column `Wins (n.s.)` (not "
        "significant): read them as measurements, not findings."
    )
    assert note in headline
    # The headline, then the gain over base, the data and the long per-group tables, the note just above them.
    order = ["## Headline", "## Gain over base", "## Data", "## Results", note, "## Seen pool", "### r = 4"]
    position = 0
    for part in order:
        position = text.index(part, position)  # each after the one before
    assert "| lora | -66.67 |" in text  # the gain is printed as measured
    tables = text.split("\n## Seen pool\n")[1]
    assert "**" not in tables
    assert "| Method | en | fr | Mean | Wins (n.s.) |" in tables
    assert "| fedit | 50.00 | 50.00 | 50.00 | 2 |" in tables


def test_one_seed_with_enough_test_examples_names_what_the_clients_support(tmp_path):
    text = write_summary([one_seed_run(tmp_path, test_per_client=40.0)], tmp_path / "out")
    headline = text.split("## Headline\n\n")[1].split("\n## ")[0]
    assert (
        "**Evidence: supported over the clients, not over seeds.** These results rest on\n\n- one seed: no spread "
        "over seeds. Over that seed's clients the 95 % intervals support r = 4: fedit minus lora" in headline
    )
    assert "the seed's own draw, which moves every client together, is not in these intervals." in headline
    assert headline.rstrip().endswith("more `seeds` tell whether these differences hold beyond this seed.")


def test_one_seed_without_a_supported_difference_is_too_little_to_call(tmp_path):
    lora = {"en-0": 0.6, "en-1": 0.4, "fr-0": 0.6, "fr-1": 0.4}  # as far above base as below: no supported gap
    records = [result("base", None, client, 0, 0.5) for client in lora]
    records += [result("lora", 4, client, 0, value) for client, value in lora.items()]
    text = write_summary([data_json(write_run(tmp_path / "run", records), 40.0)], tmp_path / "out")
    assert "r = 4: no method above base (best: lora 50.00 vs base 50.00, +0.00)." in text
    assert "**Evidence: too little to call a winner.**" in text and "Over that seed's clients" not in text


def test_summary_on_enough_evidence_has_no_note_and_bold_winners(tmp_path):
    text = write_summary([two_seed_run(tmp_path)], tmp_path / "out")
    assert "Evidence" not in text and "n.s." not in text
    assert text.index("## Headline") < text.index("## Gain over base") < text.index("## Results")
    assert "(x100, mean over the pool's clients, mean over seeds): r = 2: fedp2eft 67.50 ± 3.54 vs base 50.00" in text
    assert "| fedp2eft | **75.00 ± 7.07** | **60.00 ± 14.14** | **67.50 ± 3.54** | 2 |" in text


def test_continual_table_on_one_seed_marks_no_best_value():
    from fedpeft.report import continual_sections

    records = [
        {"method": method, "budget": None, "pool": "seen", "client": "c0", "group": "g", "seed": 0, "round": 5,
         "split": split, "metric": "accuracy", "value": value}
        for method, split, value in (("m", "test", 0.6), ("m", "others", 0.2), ("n", "test", 0.4), ("n", "others", 0.3))
    ]  # fmt: skip
    text = "\n\n".join(continual_sections(records))
    assert "On one seed no value is bold: differences between methods may be noise." in text
    assert "**" not in text and "| m | 60.00 | 60.00 | 20.00 | 20.00 |" in text


# ---------------------------------------------------------------------------------------------- CSV and LaTeX


def test_latex_tables_fit_the_page_and_mark_no_winner_on_thin_evidence(tmp_path):
    results, _ = read_records([one_seed_run(tmp_path)])
    text = render_latex(results, {"seen": 1.0})
    assert "\\usepackage{booktabs} and \\usepackage{graphicx}" in text.splitlines()[0]
    fit = "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%\n\\begin{tabular}"
    assert text.count(fit) == text.count("\\begin{tabular}") == 2  # the result table and the gain table
    assert text.count("\\end{tabular}}\n\\end{table}") == 2
    assert "\\textbf" not in text
    assert "Method & en & fr & Mean & Wins (n.s.) \\\\" in text
    assert "Too little evidence to call a winner (one seed, few test examples): no bold; Wins not significant." in text
    enough, _ = read_records([two_seed_run(tmp_path / "two")])
    text = render_latex(enough, {"seen": 40.0})
    assert "\\textbf{67.50 $\\pm$ 3.54}" in text and "Too little evidence" not in text


def test_csv_names_the_evidence_and_has_no_best_cell_on_thin_evidence(tmp_path):
    results, _ = read_records([one_seed_run(tmp_path)])
    rows = list(csv.DictReader(io.StringIO(render_csv(results, {"seen": 1.0}))))
    cells = [r for r in rows if r["table"] == "results"]
    assert {r["evidence"] for r in cells} == {"one seed; few test examples"} and {r["best"] for r in cells} == {"0"}
    fedit = next(r for r in cells if (r["method"], r["column"]) == ("fedit", "Mean"))
    assert fedit["wins"] == "2" and fedit["text"] == "50.00"


# ---------------------------------------------------------------------------------------------- plots


def _captured_figures(monkeypatch) -> list:
    """``(file name, figure)`` of every plot fedpeft.report.plots saves from now on."""
    import fedpeft.report.plots as plots

    figures = []
    save = plots.save_figure

    def capture(figure, path, **kwargs):
        figures.append((Path(path).name, figure))
        return save(figure, path, **kwargs)

    monkeypatch.setattr(plots, "save_figure", capture)
    return figures


def test_heatmap_has_a_panel_and_a_labelled_colour_scale_per_budget(tmp_path, monkeypatch):
    captured = _captured_figures(monkeypatch)
    records = [{**r, "group": "fr" if r["group"] == "en" else "en"} for r in classification_records()]
    write_plots([write_run(tmp_path / "run", records)], tmp_path / "plots")
    figures = dict(captured)
    heatmap = figures["groups_seen_accuracy.png"]
    panels = [axes for axes in heatmap.axes if axes.images]
    assert [axes.get_title() for axes in panels] == ["r = 2 (its own colour scale)", "r = 4 (its own colour scale)"]
    limits = [axes.images[0].get_clim() for axes in panels]
    assert limits[0] != limits[1]  # each budget its own colour scale
    bars = [axes for axes in heatmap.axes if not axes.images]
    assert [axes.get_ylabel() for axes in bars] == ["Accuracy x100 (higher = better)"] * 2
    # The groups in the order of the summary's tables (first seen: fr, then en), then Mean; rows as in the tables.
    assert [tick.get_text() for tick in panels[0].get_xticklabels()] == ["fr", "en", "Mean"]
    assert [tick.get_text() for tick in panels[1].get_yticklabels()] == ["base", "lora"]
    assert heatmap.get_suptitle() == "seen pool: Accuracy, mean over each group's clients, mean over 2 seeds"
    assert figures["mean_seen.png"].axes[0].get_title() == "seen pool: mean over clients, ± SD over seeds"


def test_heatmap_makes_room_for_long_group_names(tmp_path, monkeypatch):
    """Groups named as SNI's tasks (up to 40 characters, set at 45 degrees) with one method and one budget: the
    panel keeps a height (constrained layout used to collapse it to nothing, with a warning)."""
    import warnings

    captured = _captured_figures(monkeypatch)
    long = {"en": "task1342_standin_answer_verification", "fr": "task159_standin_grammar_error_detection"}
    records = [{**r, "group": long.get(r["group"], r["group"])} for r in classification_records() if r["budget"] != 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "constrained_layout not applied" is a UserWarning
        write_plots([write_run(tmp_path / "run", records)], tmp_path / "plots")
    heatmap = dict(captured)["groups_seen_accuracy.png"]
    (panel,) = [axes for axes in heatmap.axes if axes.images]
    assert panel.get_position().height > 0.1


def test_plot_titles_promise_no_spread_with_one_seed(tmp_path, monkeypatch):
    captured = _captured_figures(monkeypatch)
    write_plots([one_seed_run(tmp_path)], tmp_path / "plots")
    titles = {name: [a.get_title() for a in figure.axes] + [figure.get_suptitle()] for name, figure in captured}
    assert "±" not in str(titles)
    assert titles["mean_seen.png"][0] == "seen pool: mean over clients, one seed (0)"
    assert titles["groups_seen_accuracy.png"][-1] == "seen pool: Accuracy, mean over each group's clients, one seed (0)"


# ---------------------------------------------------------------------------------------------- no torch


def test_report_imports_no_torch(tmp_path):
    run = one_seed_run(tmp_path)
    (run / "config.yaml").write_text("methods:\n  - {name: lora}\n  - {name: fedit}\n")
    out, tables = tmp_path / "report", tmp_path / "tables"
    argv = ["fedpeft", "report", str(run), "--out", str(out), "--csv", str(tables), "--latex", str(tables)]
    program = (
        "import sys\n"
        "from fedpeft.cli import main\n"
        f"sys.argv = {argv!r}\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        "from fedpeft.report.method_hooks import hook_function\n"
        "print('hooks:', [n for n in ('lora', 'fedit', 'potara') if hook_function(n, 'report_sections')])\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "hooks: ['potara']" in done.stdout
    assert "torch imported: False" in done.stdout
    assert "Evidence: too little to call a winner" in (out / "summary.md").read_text()
    assert (out / "plots" / "groups_seen_accuracy.png").is_file() and (tables / "summary.tex").is_file()


@pytest.mark.parametrize(
    ("base", "noted"),
    [
        ("base: {kind: centralized, epochs: 1}\n", True),
        ("base: {kind: centralized, epochs: 1, per_seed: true}\n", False),
        ("base: {kind: pretrained}\n", False),
        ("base: [not, a, mapping]\n", False),
        (None, False),  # no config.yaml: the report cannot tell
    ],
)
def test_summary_says_when_every_seed_started_from_one_centralized_base_model(tmp_path, base, noted):
    run = two_seed_run(tmp_path)
    if base is not None:
        (run / "config.yaml").write_text("name: x\n" + base)
    text = write_summary([run], tmp_path / "out")
    headline = text.split("## Headline\n\n")[1].split("\n## ")[0]
    assert (SHARED_BASE_NOTE in headline) is noted
    assert shared_base_note([run], seeds=1) == ""  # on one seed the Evidence note speaks
