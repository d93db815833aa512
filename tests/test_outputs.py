"""What a run leaves besides its records: adapters written once where every client keeps the same one, per client
where they differ; class names in the saved base model; the Data section as tables that `report` keeps; plots in
every format and without blank or cut panels; the result tables as CSV and LaTeX."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedpeft.core.config import load_config
from fedpeft.core.errors import UserError
from fedpeft.core.figures import parse_formats, plot_formats, save_figure
from fedpeft.report import read_records, render_csv, render_info, render_latex, write_csv, write_latex, write_summary
from fedpeft.runner import Experiment, data_overview
from fedpeft.worker import adapter_dir, labelled_config, same_tensors

RUN = [
    "data.groups=[lat1, lat4]",
    "budgets=[2]",
    "output.plot_formats=[png, pdf, svg]",
    "methods=[{name: fedit, rounds: 2, fraction: 0.5, local_steps: 3, lr: 0.005}, "
    "{name: fedit, label: fedit-ft, rounds: 1, fraction: 0.5, local_steps: 2, lr: 0.005, finetune_epochs: 1}, "
    "{name: local, rounds: 1, local_steps: 2, lr: 0.005}, {name: lora, lr: 0.005, epochs: 1}]",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("outputs") / "run"
    Experiment(load_config("smoke", RUN), out).run()
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


# ---------------------------------------------------------------------------------------------- adapters


def test_adapter_dirs():
    run = Path("run")
    assert adapter_dir(run, "fedit", None, None) == run / "adapters" / "fedit" / "global"
    assert adapter_dir(run, "local", None, "c-0") == run / "adapters" / "local" / "clients" / "c-0"
    assert adapter_dir(run, "lora", 4, "c-0") == run / "adapters" / "lora" / "r4" / "c-0"
    assert adapter_dir(run, "flame", "tier4", "c-0") == run / "adapters" / "flame" / "tier4" / "c-0"
    assert adapter_dir(run, "hetlora", 4, None) == run / "adapters" / "hetlora" / "r4" / "global"


def test_same_tensors_compares_names_dtypes_shapes_and_values():
    a = {"x": torch.ones(2, 3), "y": torch.zeros(1)}
    assert same_tensors(a, {k: v.clone() for k, v in a.items()})
    assert not same_tensors(a, {"x": torch.ones(2, 3)})
    assert not same_tensors(a, {"x": torch.ones(2, 3, dtype=torch.float64), "y": torch.zeros(1)})
    assert not same_tensors(a, {"x": torch.ones(3, 2), "y": torch.zeros(1)})
    assert not same_tensors(a, {"x": torch.ones(2, 3), "y": torch.ones(1)})


def test_one_global_adapter_written_once_and_per_client_adapters_where_clients_differ(run_dir):
    clients = {r["client"] for r in read_jsonl(run_dir / "results.jsonl") if r["method"] == "base"}
    adapters = run_dir / "adapters"
    # FedIT without fine-tuning: every client keeps the global adapter, written once, with no client directory.
    shared = adapters / "fedit" / "global"
    assert sorted(p.name for p in shared.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert [p.name for p in (adapters / "fedit").iterdir()] == ["global"]
    config = json.loads((shared / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "../../../base_model"
    assert (shared / config["base_model_name_or_path"]).resolve() == (run_dir / "base_model").resolve()
    # Fine-tuned FedIT and Local: one adapter per client, and none under global/.
    for method in ("fedit-ft", "local"):
        assert [p.name for p in (adapters / method).iterdir()] == ["clients"], method
        assert {p.name for p in (adapters / method / "clients").iterdir()} == clients, method
        config = json.loads((adapters / method / "clients" / "lat1-seen-00" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "../../../../base_model"
    assert {p.name for p in (adapters / "lora" / "r2").iterdir()} == clients


def test_the_global_adapter_loads_with_peft_and_reproduces_every_clients_accuracy(run_dir):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from fedpeft.worker import Worker

    worker = Worker(load_config(str(run_dir / "config.yaml")), run_dir)
    base = AutoModelForSequenceClassification.from_pretrained(run_dir / "base_model")
    model = PeftModel.from_pretrained(base, run_dir / "adapters" / "fedit" / "global").eval()
    logged = {r["client"]: r["value"] for r in read_jsonl(run_dir / "results.jsonl") if r["method"] == "fedit"}
    for client_id in ("lat1-seen-00", "lat4-unseen-01"):
        batch = worker.runtime.encode(worker.clients[client_id].test)
        labels = batch.pop("labels")
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(-1)
        assert int((predictions == labels).sum()) / len(labels) == pytest.approx(logged[client_id], abs=1e-9)


# ---------------------------------------------------------------------------------------------- base model


def test_saved_base_model_names_its_classes(run_dir):
    config = json.loads((run_dir / "base_model" / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    assert config["label2id"] == {"entailment": 0, "neutral": 1, "contradiction": 2}


def test_labelled_config_is_a_copy_and_only_when_the_head_fits():
    from transformers import BertConfig

    config = BertConfig(num_labels=2)
    named = labelled_config(config, ["no", "yes"])
    assert named.id2label == {0: "no", 1: "yes"} and named.label2id == {"no": 0, "yes": 1}
    assert config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    assert labelled_config(config, ["a", "b", "c"]) is config and labelled_config(config, None) is config


# ---------------------------------------------------------------------------------------------- Data section


@pytest.mark.slow
def test_data_section_is_tables_and_report_keeps_it(run_dir, tmp_path):
    overview = json.loads((run_dir / "data.json").read_text())
    assert overview["labels"] == ["entailment", "neutral", "contradiction"]
    assert overview["groups"]["lat1"]["seen clients"] == 2 and overview["groups"]["lat4"]["resource level"] == "low"
    summary = (run_dir / "summary.md").read_text()
    data = summary.split("## Data\n\n")[1].split("\n## ")[0]
    assert "{" not in data and "'" not in data  # no Python dict or list
    assert "| labels | entailment, neutral, contradiction |" in data
    assert re.search(r"^\| lat4 \| 2 \| .* \| low \|", data, flags=re.MULTILINE)
    for line in data.splitlines():  # nothing but tables and their bold titles
        assert not line or line.startswith("|") or re.fullmatch(r"\*\*[^*]+\*\*", line), line
    # `fedpeft report` prints the same Data section (from data.json), also for several runs of the same data.
    result = cli("report", str(run_dir), str(run_dir), "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    merged = (tmp_path / "report" / "summary.md").read_text()
    assert merged.split("## Data\n\n")[1].split("\n## Results")[0] == data.split("\n## Results")[0]
    assert (tmp_path / "report" / "plots").is_dir()
    # --no-plots writes the same summary and no plots.
    result = cli("report", str(run_dir), str(run_dir), "--out", str(tmp_path / "summary-only"), "--no-plots")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "summary-only" / "summary.md").read_text() == merged
    assert not (tmp_path / "summary-only" / "plots").exists()


def test_render_info_flattens_nested_mappings():
    info = {
        "samples": 100,
        "pools": ["seen", "unseen"],
        "sizes": {"en": {"seen": {"clients": 2, "train": 120}, "unseen": {"clients": 1}}},
        "levels": {"en": "high"},
        "empty": {},
    }
    text = render_info(info)
    assert "| samples | 100 |" in text and "| pools | seen, unseen |" in text
    assert "|  | seen clients | seen train | unseen clients |" in text and "| en | 2 | 120 | 1 |" in text
    assert "**levels**" in text and "| en | high |" in text and "empty" not in text
    assert "{" not in text


def test_report_keeps_the_data_of_runs_without_data_json(tmp_path):
    from test_report import classification_records, write_run

    old = write_run(tmp_path / "old", classification_records())
    (old / "summary.md").write_text("# old\n\n## Data\n\n- **clients**: 4\n\n## Results\n\nx\n")
    text = write_summary([old], tmp_path / "out")
    assert "## Data\n\n- **clients**: 4\n\n## Results" in text
    new = write_run(tmp_path / "new", classification_records())
    (new / "data.json").write_text(json.dumps({"clients": 8}))
    text = write_summary([old, new], tmp_path / "both")
    data = text.split("## Data\n\n")[1].split("## Results")[0]
    assert f"### `{old}`" in data and f"### `{new}`" in data and "| clients | 8 |" in data
    assert "## Data" not in write_summary([old], tmp_path / "none", info={})


def test_data_overview_keeps_every_fact():
    from fedpeft.worker import build_data

    data = build_data(load_config("smoke", ["data.groups=[lat1, cyr1]"]))
    overview = data_overview(data)
    assert list(overview)[:3] == ["dataset", "task", "labels"]
    assert "edits" in overview and "group sizes" in overview  # tables other than per-group facts stay
    assert overview["groups"]["cyr1"]["seen clients"] == 0 and "unseen train/client" in overview["groups"]["cyr1"]


# ---------------------------------------------------------------------------------------------- plots


def test_run_writes_every_plot_in_every_format(run_dir):
    plots = run_dir / "plots"
    stems = {p.stem for p in plots.iterdir()}
    assert "mean_seen" in stems and "groups_unseen_accuracy" in stems
    for stem in stems:
        for fmt, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF"), ("svg", b"<?xml")):
            assert (plots / f"{stem}.{fmt}").read_bytes()[:5].startswith(magic), f"{stem}.{fmt}"


def test_plot_formats_parse_and_refuse_unknown_ones(tmp_path):
    assert parse_formats("PNG, pdf,png") == ("png", "pdf")
    for bad in ("gif", "", "png,jpg"):
        with pytest.raises(UserError, match="png, pdf, svg"):
            parse_formats(bad)
    from matplotlib.figure import Figure

    figure = Figure()
    figure.add_subplot().plot([0, 1])
    with plot_formats(["svg", "pdf"]):
        assert save_figure(figure, tmp_path / "a.png") == [tmp_path / "a.svg", tmp_path / "a.pdf"]
    assert save_figure(figure, tmp_path / "b.png") == [tmp_path / "b.png"]


def _scale_records(identical: bool):
    from fedpeft.analysis.scales import ScaleRecord

    modules = [f"enc.layer.{layer}.{kind}" for layer in range(2) for kind in ("query", "value")]
    generator = torch.Generator().manual_seed(0)
    records = []
    for index, group in enumerate(["lat1", "lat1", "lat4", "lat4", "cyr1", "cyr1"]):
        scales = torch.full((4, 4), 0.5) if identical else torch.rand(4, 4, generator=generator)
        records.append(ScaleRecord("fedp2eft", 0, f"{group}-{index}", group, "seen", modules, 4, scales.numpy()))
    return records


def _capture_figures(monkeypatch) -> list:
    import fedpeft.analysis.scale_plots as scale_plots

    figures = []

    def capture(figure, path, **kwargs):
        figures.append(figure)
        return save_figure(figure, path, **kwargs)

    monkeypatch.setattr(scale_plots, "save_figure", capture)
    return figures


def _inside(figure) -> bool:
    """Whether every text of the figure lies inside it (a cut title lies partly outside)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = figure.bbox
    texts = [t for t in figure.findobj(lambda a: hasattr(a, "get_text") and a.get_text()) if t.get_visible()]
    for text in texts:
        extent = text.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.x1 > box.x1 + 1 or extent.y0 < box.y0 - 1 or extent.y1 > box.y1 + 1:
            return False
    return bool(texts)


@pytest.mark.parametrize("identical", [True, False])
def test_lambda_distance_plot_is_drawn_whole(identical, tmp_path, monkeypatch):
    import matplotlib.image

    from fedpeft.analysis.scale_plots import plot_language_distances

    figures = _capture_figures(monkeypatch)
    path = tmp_path / "lambda_distance_fedp2eft.png"
    title = "fedp2eft: distance of the clients' lambda (rank scales) between groups"
    plot_language_distances(_scale_records(identical), path, title)
    pixels = matplotlib.image.imread(path)[..., :3]
    # A blank heatmap (every cell NaN, drawn as nothing) left over 90 % of the image white.
    assert (pixels > 0.97).all(-1).mean() < 0.8
    assert _inside(figures[0])
    cells = [t.get_text() for t in figures[0].axes[0].texts]
    assert len(cells) == 9 and (all(c == "n/a" for c in cells) if identical else "n/a" not in cells)


def test_rank_structure_draws_the_runs_budgets(tmp_path, monkeypatch):
    from fedpeft.analysis.scale_plots import write_scale_plots
    from fedpeft.analysis.scales import save_client_scales, scales_path

    run = tmp_path / "run"
    for record in _scale_records(False):
        save_client_scales(scales_path(run, record.method, record.seed, record.client), record)
    (run / "config.yaml").write_text("budgets: [1, 3, 8]\n")
    figures = _capture_figures(monkeypatch)
    with plot_formats("png,pdf"):
        written = write_scale_plots(run, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "lambda_distance_fedp2eft.pdf",
        "lambda_distance_fedp2eft.png",
        "rank_structure_fedp2eft.pdf",
        "rank_structure_fedp2eft.png",
    ]
    titles = [axes.get_title() for axes in figures[0].axes if axes.get_title()]
    assert titles == ["r = 1", "r = 3"]  # the run's budgets up to r_max = 4
    # The budgets the method's records were evaluated at win over the config's.
    (run / "results.jsonl").write_text(json.dumps({"method": "fedp2eft", "budget": 2}) + "\n")
    write_scale_plots(run, tmp_path / "plots")
    assert [axes.get_title() for axes in figures[2].axes if axes.get_title()] == ["r = 2"]
    assert all(_inside(figure) for figure in figures)


# ---------------------------------------------------------------------------------------------- CSV and LaTeX


def _report_run(tmp_path: Path) -> Path:
    from test_report import classification_records, write_run

    return write_run(tmp_path / "run", classification_records() + classification_records("unseen"))


def test_csv_holds_every_printed_cell(tmp_path):
    run = _report_run(tmp_path)
    results, _ = read_records([run])
    rows = list(csv.DictReader(io.StringIO(render_csv(results))))
    cell = next(
        r
        for r in rows
        if r["table"] == "results"
        and (r["pool"], r["budget"], r["method"], r["column"]) == ("seen", "2", "fedp2eft", "fr")
    )
    assert float(cell["mean"]) == pytest.approx(60.0) and float(cell["sd"]) == pytest.approx(14.1421356)
    assert cell["text"] == "60.00 ± 14.14" and cell["best"] == "1" and cell["wins"] == "2" and cell["seeds"] == "2"
    base = next(r for r in rows if r["method"] == "base" and r["column"] == "Mean" and r["table"] == "results")
    assert base["wins"] == "" and base["best"] == "0"
    gain = next(r for r in rows if r["table"] == "gain" and r["method"] == "lora" and r["budget"] == "4")
    assert gain["column"] == "r = 4" and gain["text"] == "+40.00" and gain["sd"] == ""
    # Every cell of the markdown tables is in the CSV.
    summary = write_summary([run], tmp_path / "out")
    texts = {r["text"] for r in rows}
    for line in summary.splitlines():
        if line.startswith(("| lora", "| fedp2eft", "| base")):
            for cell_text in line.strip("|").split("|")[1:]:
                value = cell_text.strip().strip("*")
                if re.fullmatch(r"[+-]?\d+\.\d\d( ± \d+\.\d\d)?", value):
                    assert value in texts, value
    path = write_csv([run], tmp_path / "tables")
    assert path == tmp_path / "tables" / "summary.csv" and path.read_text() == render_csv(results)
    assert write_csv([run], tmp_path / "t.csv") == tmp_path / "t.csv"


def test_latex_tables_hold_the_markdown_numbers(tmp_path):
    run = _report_run(tmp_path)
    results, _ = read_records([run])
    text = render_latex(results)
    assert text.count(r"\begin{tabular}") == text.count(r"\end{tabular}") == 6  # 2 pools x 2 budgets + 2 gains
    assert r"\toprule" in text and r"\midrule" in text and r"\bottomrule" in text
    row = r"fedp2eft & \textbf{75.00 $\pm$ 7.07} & \textbf{60.00 $\pm$ 14.14} & \textbf{67.50 $\pm$ 3.54} & 2 \\"
    assert row in text
    assert r"lora & +12.50 $\pm$ 3.54 & +40.00 \\" in text
    assert "base & 50.00 $\\pm$ 0.00" in text and text.count("& --- \\\\") >= 4  # base has no Wins
    lines = [line for line in text.splitlines() if "fedp2eft" in line]
    assert all("_" not in line.replace(r"\_", "") for line in lines)
    path = write_latex([run], tmp_path / "paper.tex")
    assert path.read_text() == text


def test_latex_escapes_names():
    from fedpeft.report.export import latex_escape

    assert latex_escape("fedit_ft 100% & #1") == r"fedit\_ft 100\% \& \#1"


@pytest.mark.slow
def test_report_cli_writes_csv_latex_and_plot_formats(tmp_path):
    run = _report_run(tmp_path)
    out = tmp_path / "report"
    result = cli(
        "report", str(run), "--out", str(out), "--plot-format", "png,svg",
        "--csv", str(tmp_path / "tables"), "--latex", str(tmp_path / "tables" / "paper.tex"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "tables" / "summary.csv").is_file() and (tmp_path / "tables" / "paper.tex").is_file()
    assert {p.suffix for p in (out / "plots").iterdir()} == {".png", ".svg"}
    bad = cli("report", str(run), "--out", str(tmp_path / "bad"), "--plot-format", "gif")
    assert bad.returncode == 2 and "png, pdf, svg" in bad.stderr and not (tmp_path / "bad").exists()
    bad = cli("run", "smoke", "--out", str(tmp_path / "bad-run"), "--plot-format", "png,gif")
    assert bad.returncode == 2 and "png, pdf, svg" in bad.stderr and not (tmp_path / "bad-run").exists()


def test_lambda_distance_plot_says_what_it_measures_in_the_tables_group_order(tmp_path, monkeypatch):
    from fedpeft.analysis.scale_plots import DISTANCE_LABEL, write_scale_plots
    from fedpeft.analysis.scales import save_client_scales, scales_path

    run = tmp_path / "run"
    for record in _scale_records(False):
        save_client_scales(scales_path(run, record.method, record.seed, record.client), record)
    order = ["lat4", "cyr1", "lat1"]  # the records' first-seen order, as the per-group tables have it
    (run / "results.jsonl").write_text("".join(json.dumps({"method": "base", "group": g}) + "\n" for g in order))
    figures = _capture_figures(monkeypatch)
    write_scale_plots(run, tmp_path / "plots")
    heatmap, colorbar = figures[-1].axes[:2]
    assert [label.get_text() for label in heatmap.get_xticklabels()] == order
    assert colorbar.get_ylabel().replace("\n", " ") == DISTANCE_LABEL
    assert "lower = more similar" in DISTANCE_LABEL
