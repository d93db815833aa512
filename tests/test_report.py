"""Report tables, Wins, gain over base, costs, merging of runs and plots, on hand-made records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entry_point import report_in_a_fresh_process

from fedpeft.core.errors import UserError
from fedpeft.report import (
    budget_order,
    combined_wins,
    cost_cells,
    gain_over_base,
    group_table,
    read_records,
    render_compute_table,
    render_cost_tables,
    render_group_table,
    write_plots,
    write_summary,
)

CLIENTS = {"en-0": "en", "en-1": "en", "fr-0": "fr", "fr-1": "fr"}
# method -> budget -> seed -> client -> accuracy. Per-group means by seed:
#   lora     en .65 / .75, fr .65 / .45   -> en 70.00 ± 7.07, fr 55.00 ± 14.14, Mean 62.50 ± 3.54
#   fedp2eft en .70 / .80, fr .70 / .50   -> en 75.00 ± 7.07, fr 60.00 ± 14.14, Mean 67.50 ± 3.54
# fedp2eft - lora is 5 points on every client (4.9 or 5.1 over the seeds), so its 95 % interval lies above 0 in every
# column: fedp2eft is bold and wins both groups (tests/test_report_intervals.py has ties and overlapping methods).
ACCURACY = {
    "lora": {
        2: {
            0: {"en-0": 0.652, "en-1": 0.648, "fr-0": 0.652, "fr-1": 0.648},
            1: {"en-0": 0.75, "en-1": 0.75, "fr-0": 0.45, "fr-1": 0.45},
        },
        4: {0: {"en-0": 0.9, "en-1": 0.9, "fr-0": 0.9, "fr-1": 0.9}},
    },
    "base": {None: {seed: dict.fromkeys(CLIENTS, 0.5) for seed in (0, 1)}},
    "fedp2eft": {
        2: {
            0: {"en-0": 0.7, "en-1": 0.7, "fr-0": 0.7, "fr-1": 0.7},
            1: {"en-0": 0.8, "en-1": 0.8, "fr-0": 0.5, "fr-1": 0.5},
        }
    },
}


def result(method, budget, client, seed, value, *, metric="accuracy", pool="seen", group=None, round_=10):
    return {
        "method": method,
        "budget": budget,
        "pool": pool,
        "client": client,
        "group": group or CLIENTS[client],
        "seed": seed,
        "round": None if method == "base" else round_,
        "split": "test",
        "metric": metric,
        "value": value,
    }


def classification_records(pool: str = "seen") -> list[dict]:
    return [
        result(method, budget, client, seed, value, pool=pool)
        for method, budgets in ACCURACY.items()
        for budget, seeds in budgets.items()
        for seed, clients in seeds.items()
        for client, value in clients.items()
    ]


def add_personalize_facts(run: Path, facts: list[tuple[str, str, float]]) -> None:
    """Append ``(method, metric, value)`` facts of client en-0, seed 0 (split ``personalize``) to a run's results."""
    with (run / "results.jsonl").open("a") as handle:
        for method, metric, value in facts:
            record = {"method": method, "client": "en-0", "seed": 0, "split": "personalize", "metric": metric}
            handle.write(json.dumps({**record, "budget": None, "pool": "seen", "group": "en", "value": value}) + "\n")


def write_run(run_dir: Path, results: list[dict], costs: list[dict] | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    if costs is not None:
        (run_dir / "costs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in costs))
    return run_dir


def cost(method, seed, phase, metric, value):
    return {"method": method, "seed": seed, "phase": phase, "metric": metric, "value": value}


COSTS = [
    cost("lora", 0, "federated", "wall_s_per_client_round", 1.5),
    cost("lora", 1, "federated", "wall_s_per_client_round", 2.5),
    cost("lora", 0, "federated", "bytes_up_per_client_round", 2048),
    cost("lora", 1, "federated", "bytes_up_per_client_round", 2048),
    cost("lora", 0, "personalization", "wall_s_per_client", 0.25),
    cost("lora", 0, "federated", "bytes_up_total", 3 * 1024 * 1024),
    cost("base", 0, "base", "wall_s", 12.0),
]


def test_group_table_means_sds_wins_and_ties():
    table = group_table(classification_records(), pool="seen", metric="accuracy", budget=2)
    assert table.methods == ["base", "lora", "fedp2eft"]
    assert table.groups == ["en", "fr"]
    assert table.row_budgets == {"base": None, "lora": 2, "fedp2eft": 2}
    expected = {
        ("lora", "en"): (0.70, 0.0707107),
        ("lora", "fr"): (0.55, 0.1414214),
        ("lora", "Mean"): (0.625, 0.0353553),
        ("fedp2eft", "en"): (0.75, 0.0707107),
        ("fedp2eft", "fr"): (0.60, 0.1414214),
        ("fedp2eft", "Mean"): (0.675, 0.0353553),
        ("base", "Mean"): (0.5, 0.0),
    }
    for key, (mean, sd) in expected.items():
        assert table.cells[key].mean == pytest.approx(mean)
        assert table.cells[key].sd == pytest.approx(sd, abs=1e-6)
        assert table.cells[key].seeds == 2
    assert table.best == table.bold == {"en": {"fedp2eft"}, "fr": {"fedp2eft"}, "Mean": {"fedp2eft"}}
    assert table.wins == {"lora": 0, "fedp2eft": 2}
    reference, interval = table.against["fedp2eft", "en"]  # what decides the bold cell: fedp2eft - lora over en
    assert reference == "lora" and interval.clients == 2 and interval.mean == pytest.approx(0.05)
    assert table.against["lora", "Mean"][0] == "fedp2eft" and table.against["lora", "Mean"][1].high < 0


def test_rendered_table_bold_best_and_base_without_wins():
    text = render_group_table(group_table(classification_records(), pool="seen", metric="accuracy", budget=2))
    lines = text.splitlines()
    assert lines[0] == "| Method | en | fr | Mean | Wins |"
    assert lines[2] == "| base | 50.00 ± 0.00 | 50.00 ± 0.00 | 50.00 ± 0.00 | — |"
    assert lines[3] == "| lora | 70.00 ± 7.07 | 55.00 ± 14.14 | 62.50 ± 3.54 | 0 |"
    assert lines[4] == "| fedp2eft | **75.00 ± 7.07** | **60.00 ± 14.14** | **67.50 ± 3.54** | 2 |"


def test_single_seed_has_no_sd_and_base_never_competes():
    # At r = 4 only lora (one seed) competes with base.
    table = group_table(classification_records(), pool="seen", metric="accuracy", budget=4)
    assert table.methods == ["base", "lora"]
    assert table.cells["lora", "en"].sd is None
    lines = render_group_table(table).splitlines()
    assert lines[3] == "| lora | **90.00** | **90.00** | **90.00** | 2 |"
    # base (0.5) beats lora (0.1) everywhere, yet the best goes to lora: base is the reference. With no other method
    # lora is judged against base, and it is no win (it was one before the 95 % intervals: a best cell far below the
    # reference is not a finding).
    records = [r for r in classification_records() if r["method"] in ("base", "lora")]
    records = [{**r, "value": 0.1} if r["method"] == "lora" else r for r in records]
    table = group_table(records, pool="seen", metric="accuracy", budget=2)
    assert table.best["en"] == {"lora"} and table.bold["en"] == set() and table.wins == {"lora": 0}
    assert table.against["lora", "en"][0] == "base"


def test_generation_wins_need_two_of_three_metrics_with_ties():
    # group -> metric -> {method: value}: g1 A best twice; g2 each best once (no winner); g3 A and B tie on
    # METEOR, so each is bold once (B ROUGE-1, A ROUGE-L): no winner (before the 95 % intervals a tie made both
    # best, and both won); g4 B best twice. Three clients per group, each method a little noise of its own around
    # the value, so that the intervals exist; a tie is never bold.
    values = {
        "g1": {"meteor": (0.9, 0.1, 0.1), "rouge1": (0.9, 0.1, 0.1), "rougeL": (0.1, 0.9, 0.1)},
        "g2": {"meteor": (0.9, 0.1, 0.1), "rouge1": (0.1, 0.9, 0.1), "rougeL": (0.1, 0.1, 0.9)},
        "g3": {"meteor": (0.5, 0.5, 0.1), "rouge1": (0.1, 0.9, 0.1), "rougeL": (0.9, 0.1, 0.1)},
        "g4": {"meteor": (0.1, 0.9, 0.1), "rouge1": (0.1, 0.1, 0.9), "rougeL": (0.1, 0.9, 0.1)},
    }
    noise = {"A": (-0.001, 0.0, 0.001), "B": (0.0, 0.0, 0.0), "C": (0.001, 0.0, -0.001)}
    records = [
        result(method, 8, f"{group}-{k}", 0, triple[i] + noise[method][k], metric=metric, group=group)
        for group, metrics in values.items()
        for metric, triple in metrics.items()
        for i, method in enumerate("ABC")
        for k in range(3)
    ]
    tables = [group_table(records, pool="seen", metric=m, budget=8) for m in ("meteor", "rouge1", "rougeL")]
    assert tables[0].best["g3"] == {"A", "B"} and tables[0].bold["g3"] == set()
    assert tables[0].wins == {"A": 2, "B": 1, "C": 0}
    assert combined_wins(tables) == {"A": 1, "B": 1, "C": 0}


def test_gain_over_base_pairs_client_and_seed():
    gains = gain_over_base(classification_records(), pool="seen", metric="accuracy")
    assert set(gains) == {("lora", 2), ("lora", 4), ("fedp2eft", 2)}
    assert gains["lora", 2].mean == pytest.approx(0.125)
    assert gains["lora", 2].sd == pytest.approx(0.0353553, abs=1e-6)
    assert gains["fedp2eft", 2].mean == pytest.approx(0.175)
    assert gains["lora", 4].mean == pytest.approx(0.4) and gains["lora", 4].sd is None


def test_budget_order_ranks_then_tiers():
    records = [{"budget": b} for b in (4, "small", None, 2, "large", 4)]
    assert budget_order(records) == [2, 4, "small", "large"]


def test_read_records_merges_later_dir_wins(tmp_path):
    first = write_run(tmp_path / "a", classification_records(), COSTS)
    replaced = result("lora", 2, "en-0", 0, 0.99)
    late_method = result("fedl2p", 2, "en-0", 0, 0.3)
    second = write_run(
        tmp_path / "b",
        [replaced, late_method],
        [cost("lora", 0, "federated", "wall_s_per_client_round", 9.0)],
    )
    results, costs = read_records([first, second])
    assert len(results) == len(classification_records()) + 1
    lora_en0 = [r for r in results if r["method"] == "lora" and r["client"] == "en-0" and r["budget"] == 2]
    assert [r["value"] for r in lora_en0 if r["seed"] == 0] == [0.99]
    assert [r["method"] for r in results][-1] == "fedl2p"
    cells = cost_cells(costs)
    assert cells["lora", "federated", "wall_s_per_client_round"].mean == pytest.approx((9.0 + 2.5) / 2)
    results, _ = read_records([second, first])
    lora_en0 = [r for r in results if r["method"] == "lora" and r["client"] == "en-0" and r["budget"] == 2]
    assert [r["value"] for r in lora_en0 if r["seed"] == 0] == [0.652]


def test_read_records_keeps_compute_records_of_every_budget(tmp_path):
    """Per-tier compute records differ only in their budget: each tier keeps its own row."""
    compute = [
        {**cost("flame", 0, "compute", "forward_flops", flops), "budget": tier}
        for tier, flops in (("tier1", 8e6), ("tier2", 4e6), ("tier4", 1e6))
    ]
    run = write_run(tmp_path / "r", [result("flame", "tier1", "en-0", 0, 0.5)], compute)
    _, costs = read_records([run])
    assert sorted((c["budget"], c["value"]) for c in costs) == [("tier1", 8e6), ("tier2", 4e6), ("tier4", 1e6)]
    table = render_compute_table(costs)
    assert "| flame | tier2 | — | — | — | 0.004 G | 50.0 % | — |" in table
    assert "| flame | tier4 | — | — | — | 0.001 G | 12.5 % | — |" in table


def test_read_records_keeps_latest_round_within_a_run(tmp_path):
    run = write_run(tmp_path / "r", [result("lora", 2, "en-0", 0, 0.8, round_=20), result("lora", 2, "en-0", 0, 0.4)])
    results, costs = read_records([run])
    assert [r["value"] for r in results] == [0.8] and costs == []


def test_read_records_errors_name_the_fix(tmp_path):
    with pytest.raises(UserError, match="fedpeft run"):
        read_records([tmp_path / "missing"])
    run = tmp_path / "bad"
    run.mkdir()
    (run / "results.jsonl").write_text('{"method": "x"}\nnot json\n')
    with pytest.raises(UserError, match="line 2"):
        read_records([run])


def test_cost_tables():
    text = render_cost_tables(COSTS)
    lines = text.split("\n\n")[0].splitlines()
    assert lines[0] == "| Method | Fed. s / client-round | Fed. up / client-round | Pers. s / client |"
    assert lines[2] == "| lora | 2.000 ± 0.707 | 2.00 KiB | 0.250 |"
    totals = text.split("\n\n")[1].splitlines()
    assert totals[0] == "| Method | Phase | Up total | Wall s |"
    assert "| base | base | — | 12.000 |" in totals
    assert "| lora | federated | 3.00 MiB | — |" in totals


def test_write_summary(tmp_path):
    unseen = [r for r in classification_records("unseen") if r["method"] != "fedp2eft"]
    run = write_run(tmp_path / "run", classification_records() + unseen, COSTS)
    info = {
        "samples per client": 100,
        "group sizes": {"en": 2, "fr": 2},
        "resources": {"en": {"level": "high"}},
    }
    text = write_summary([run], tmp_path / "out", title="Toy XNLI", info=info)
    assert (tmp_path / "out" / "summary.md").read_text() == text
    assert text.startswith("# Toy XNLI\n")
    assert "| samples per client | 100 |" in text
    assert "| en | high |" in text and "{" not in text.split("## Results")[0]
    assert text.index("## Seen pool") < text.index("## Unseen pool")
    assert "### r = 2 — Accuracy" in text and "### r = 4 — Accuracy" in text
    assert "budget-independent" in text
    assert "| fedp2eft | **75.00 ± 7.07** | **60.00 ± 14.14** | **67.50 ± 3.54** | 2 |" in text
    assert "## Gain over base" in text
    assert "| lora | +12.50 ± 3.54 | +40.00 |" in text
    assert "## Costs" in text
    assert "## Failed clients" not in text
    assert write_summary([run], tmp_path / "other.md") == (tmp_path / "other.md").read_text()


def test_summary_warns_about_clients_left_out(tmp_path):
    failed = [*COSTS, cost("lora", 1, "federated", "failed_client_rounds", 3.0)]
    run = write_run(tmp_path / "run", classification_records(), failed)
    text = write_summary([run], tmp_path / "out")
    section = text.split("## Failed clients")[1].split("## Costs")[0]
    assert "- **lora**, seed 1, federated: 3 client-round(s) failed and were left out of the aggregation" in section
    assert "fedp2eft" not in section
    failed = [*COSTS, cost("lora", 1, "personalization", "failed_clients", 2.0)]
    run = write_run(tmp_path / "pers", classification_records(), failed)
    section = write_summary([run], tmp_path / "pers-out").split("## Failed clients")[1].split("## Costs")[0]
    assert "- **lora**, seed 1, personalization: 2 client(s) failed personalization and have no results" in section
    assert "aggregation" not in section


def test_summary_of_generation_uses_combined_wins(tmp_path):
    records = []
    for metric, (a, b) in {"meteor": (0.5, 0.4), "rouge1": (0.3, 0.4), "rougeL": (0.6, 0.2)}.items():
        for seed in (0, 1):  # two seeds: enough evidence to mark winners (tests/test_report_evidence.py)
            # Two clients, A a little apart on them: the 95 % interval of A - B needs a spread over clients.
            records += [
                result("A", None, "en-0", seed, a - 0.001, metric=metric),
                result("A", None, "en-1", seed, a + 0.001, metric=metric),
                result("B", None, "en-0", seed, b, metric=metric),
                result("B", None, "en-1", seed, b, metric=metric),
            ]
    text = write_summary([write_run(tmp_path / "gen", records)], tmp_path)
    for label in ("METEOR", "ROUGE-1", "ROUGE-L"):
        assert f"### {label}" in text
    # B is best in ROUGE-1 only: its Wins stay 0 even in the ROUGE-1 table.
    assert text.count("| B | **40.00 ± 0.00** | **40.00 ± 0.00** | 0 |") == 1
    tables = text.split("## Results")[1]
    assert tables.count("| A | ") == 3 and tables.count(" | 1 |") == 3


def test_write_plots(tmp_path):
    # A metric measured in one pool only gets plots in that pool only.
    seen_only = result("lora", 2, "en-0", 0, 0.4, metric="meteor")
    run = write_run(tmp_path / "run", classification_records() + classification_records("unseen") + [seen_only])
    paths = write_plots([run], tmp_path / "run" / "plots")
    assert sorted(p.name for p in paths) == [
        "groups_seen_accuracy.png",
        "groups_seen_meteor.png",
        "groups_unseen_accuracy.png",
        "mean_seen.png",
        "mean_unseen.png",
    ]
    for path in paths:
        assert path.parent == tmp_path / "run" / "plots"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_methods_report_through_their_declared_hooks(tmp_path):
    # Methods come from config.yaml (label defaults to the name; an alias resolves; an unknown name is skipped),
    # never from building or importing a method; Potara and Fisher merging declare the same hooks: one table.
    run = write_run(tmp_path / "run", classification_records())
    (run / "config.yaml").write_text(
        "methods:\n"
        "  - {name: potara, label: pot}\n"
        "  - {name: fisher_merge}\n"
        "  - {name: bayestune, label: bt}\n"
        "  - {name: removed_method}\n"
        "  - {name: lora}\n"
    )
    facts = [("pot", "alpha", 0.25), ("fisher_merge", "fisher_weight_mean", 0.5), ("removed_method", "alpha", 0.9)]
    add_personalize_facts(run, facts)
    from fedpeft.report.method_hooks import method_hook_calls

    records, _ = read_records([run])
    calls = method_hook_calls(records, [run], "report_sections")
    rows_of = {f"{hook.__module__}:{hook.__name__}": sorted({r["method"] for r in rows}) for hook, rows in calls}
    # Potara's hook is the torch-free function its declaration names; lora declares none: no call.
    assert rows_of == {"fedpeft.analysis.mixing:mixing_report_sections": ["fisher_merge", "pot"]}
    text = write_summary([run], tmp_path / "out")
    assert text.count("## Mixing weights") == 1
    assert "| pot | en-0 | 0.250 | — |" in text and "| fisher_merge | en-0 | — | 0.500 |" in text
    assert "removed_method | en-0" not in text


def test_every_declared_hook_is_a_function_of_analysis_with_the_hooks_parameters():
    # A shipped method's hooks are named by its declaration, as functions of fedpeft.analysis (no torch), whose
    # parameters are those of the hook.
    import inspect

    from fedpeft.core.registry import METHODS
    from fedpeft.report.method_hooks import DECLARED, hook_function

    parameters = {"report_sections": ["records", "run_dirs"], "report_plots": ["records", "run_dirs", "out_dir"]}
    found = {}
    for name in (n for n in METHODS.names() if METHODS.entry(n).module is not None):
        for hook in DECLARED:
            function = hook_function(name, hook)
            if function is not None:
                assert function.__module__.startswith("fedpeft.analysis."), (name, hook)
                assert list(inspect.signature(function).parameters) == parameters[hook], (name, hook)
                found[name, hook] = f"{function.__module__}:{function.__name__}"
    assert found == {
        ("bayestune_lora", "report_plots"): "fedpeft.analysis.scale_plots:rank_scale_plots",
        ("fedp2eft", "report_plots"): "fedpeft.analysis.scale_plots:rank_scale_plots",
        ("fisher_merge", "report_sections"): "fedpeft.analysis.mixing:mixing_report_sections",
        ("fisher_merge", "report_plots"): "fedpeft.analysis.mixing:mixing_report_plots",
        ("potara", "report_sections"): "fedpeft.analysis.mixing:mixing_report_sections",
        ("potara", "report_plots"): "fedpeft.analysis.mixing:mixing_report_plots",
    }


def test_a_plugins_hooks_are_the_functions_it_registers_with(tmp_path, monkeypatch):
    # A plugin registers its hooks with its class (functions, or `module:name`); one that names Potara's hook
    # shares Potara's call.
    from fedpeft.core.registry import METHODS, Entry
    from fedpeft.methods.base import Method

    def own_sections(records, run_dirs):
        return ["## Own", f"{len(records)} records of {sorted({r['method'] for r in records})}"]

    class Own(Method):
        pass

    class Merging(Method):
        pass

    plugins = {
        "own_plugin": (Own, own_sections),
        "merging_plugin": (Merging, "fedpeft.analysis.mixing:mixing_report_sections"),
    }
    METHODS.names()  # the catalogue first, so that the plugins come on top of it
    for name, (cls, hook) in plugins.items():
        monkeypatch.setitem(METHODS._entries, name, Entry(name, None, "", report_sections=hook))
        monkeypatch.setitem(METHODS._objects, name, cls)
    from fedpeft.report.method_hooks import method_hook_calls

    run = write_run(tmp_path / "run", classification_records())
    (run / "config.yaml").write_text(
        "methods:\n  - {name: own_plugin, label: own}\n  - {name: merging_plugin}\n  - {name: potara}\n"
    )
    facts = [("own", "alpha", 0.1), ("merging_plugin", "alpha", 0.2), ("potara", "alpha", 0.3)]
    add_personalize_facts(run, facts)
    records, _ = read_records([run])
    calls = method_hook_calls(records, [run], "report_sections")
    assert [sorted({r["method"] for r in rows}) for _, rows in calls] == [["own"], ["merging_plugin", "potara"]]
    text = write_summary([run], tmp_path / "out")
    assert "## Own\n\n1 records of ['own']" in text
    assert text.count("## Mixing weights") == 1 and "| merging_plugin | en-0 | 0.200 |" in text


def test_register_records_a_plugins_hooks_in_its_entry():
    from fedpeft.core.registry import Registry

    def plots(records, run_dirs, out_dir):
        return []

    registry: Registry = Registry("method")
    registry.register("mine", description="a plugin's method", report_plots=plots)(object)
    entry = registry.entry("mine")
    assert (entry.report_plots, entry.report_sections, entry.module) == (plots, None, None)


def test_report_of_merging_methods_imports_no_torch(tmp_path):
    # Potara's and Fisher merging's hooks (the Mixing weights section and the mixing-weight plot) are called
    # without importing the methods, nor torch.
    run = write_run(tmp_path / "run", classification_records())
    (run / "config.yaml").write_text("methods:\n  - {name: potara, label: pot}\n  - {name: fisher_merge}\n")
    facts = [("pot", "alpha", 0.25), ("pot", "alpha_grid", 0.5), ("fisher_merge", "fisher_weight_mean", 0.5)]
    facts += [("pot", f"test_accuracy@{alpha:g}", 0.5 + alpha / 10) for alpha in (0.0, 0.5, 1.0)]
    add_personalize_facts(run, facts)
    out = tmp_path / "report"
    assert report_in_a_fresh_process(run, out) == []
    text = (out / "summary.md").read_text()
    assert text.count("## Mixing weights") == 1 and "| pot | en-0 | 0.250 | 0.500 | — |" in text
    assert (out / "plots" / "mixing_weight_pot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
