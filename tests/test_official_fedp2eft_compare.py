"""The arithmetic of benchmarks/official/fedp2eft/compare.py on fixture records, without either pipeline: seeds paired
by position, the authors' client ids mapped to fedpeft's, per-client differences and their t interval, rank
structures compared module by module, the two protocols' settings on both command lines, and Flower's timestamps
read into phase times."""

from __future__ import annotations

import ast
import importlib.util
import math
import statistics
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

FOLDER = Path(__file__).resolve().parent.parent / "benchmarks" / "official" / "fedp2eft"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"official_fedp2eft_{name}", FOLDER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


comparison = load("comparison")
compare = load("compare")

T_975_2 = 4.302652729749464  # Student's t, 0.975 quantile, 2 degrees of freedom


def record(client: str, seed: int, value: float, method: str = "fedp2eft", pool: str = "seen", budget=2) -> dict:
    return {
        "method": method,
        "budget": budget,
        "pool": pool,
        "client": client,
        "seed": seed,
        "split": "test",
        "metric": "accuracy",
        "value": value,
    }


CLIENTS = [
    {"cid": 0, "client_id": "a-seen-00", "pool": "seen", "language": "a", "train": 60, "test": 30},
    {"cid": 1, "client_id": "a-seen-01", "pool": "seen", "language": "a", "train": 60, "test": 30},
    {"cid": 2, "client_id": "b-seen-00", "pool": "seen", "language": "b", "train": 60, "test": 30},
    {"cid": 3, "client_id": "b-unseen-00", "pool": "unseen", "language": "b", "train": 60, "test": 30},
]


def test_seeds_pair_by_position_with_theirs():
    assert [comparison.their_seed(p) for p in range(3)] == [42, 52, 62]
    records = [
        record("a-seen-00", 1, 0.5),
        record("a-seen-00", 2, 0.6),
        record("a-seen-00", 7, 0.9),  # a seed not asked for
        record("a-seen-00", 1, 0.1, budget=16),
        record("a-seen-00", 1, 0.1, pool="unseen"),
        record("a-seen-00", 1, 0.1, method="lora"),
        {**record("a-seen-00", 1, 0.1), "split": "train"},
    ]
    assert comparison.fedpeft_values(records, "fedp2eft", "seen", 2, [1, 2]) == {
        ("a-seen-00", 0): 0.5,
        ("a-seen-00", 1): 0.6,
    }


def test_their_client_ids_map_to_fedpeft_clients():
    metrics = {0: {"client0_accuracy": 0.5, "client2_accuracy": 0.25, "client2_count": 30, "avg_accuracy": 40.0}}
    assert comparison.authors_values(metrics, CLIENTS) == {("a-seen-00", 0): 0.5, ("b-seen-00", 0): 0.25}
    with pytest.raises(KeyError, match="client id 9"):
        comparison.authors_values({0: {"client9_accuracy": 0.5}}, CLIENTS)


def test_difference_is_per_client_mean_over_paired_seeds_with_a_t_interval_over_clients():
    ours = {
        ("a", 0): 0.60, ("a", 1): 0.70,
        ("b", 0): 0.50, ("b", 1): 0.40,
        ("c", 0): 0.90,  # its seed 1 has no partner: left out of c's mean
        ("c", 1): 0.10,
        ("d", 0): 0.30,  # a client only fedpeft has
    }  # fmt: skip
    theirs = {("a", 0): 0.50, ("a", 1): 0.50, ("b", 0): 0.50, ("b", 1): 0.50, ("c", 0): 0.80, ("e", 0): 0.2}
    cell = comparison.compare_accuracies(ours, theirs)
    per_client = [0.15, -0.05, 0.10]  # a: (0.1 + 0.2) / 2; b: (0 - 0.1) / 2; c: 0.1
    half = T_975_2 * statistics.stdev(per_client) / math.sqrt(3)
    assert cell["clients"] == 3 and cell["pairs"] == 5
    assert cell["difference"] == pytest.approx(statistics.fmean(per_client))
    assert cell["low"] == pytest.approx(statistics.fmean(per_client) - half)
    assert cell["high"] == pytest.approx(statistics.fmean(per_client) + half)
    assert cell["fedpeft"] == pytest.approx(statistics.fmean([0.65, 0.45, 0.90]))
    assert cell["authors"] == pytest.approx(statistics.fmean([0.50, 0.50, 0.80]))
    assert cell["fedpeft"] - cell["authors"] == pytest.approx(cell["difference"])
    assert cell["only_fedpeft"] == ["d"] and cell["only_authors"] == ["e"]
    mean = statistics.fmean(per_client)
    assert comparison.format_difference(cell) == f"+6.67 [{(mean - half) * 100:+.2f}, {(mean + half) * 100:+.2f}]"


def test_intervals_of_few_clients_and_equal_differences():
    one = comparison.compare_accuracies({("a", 0): 0.6}, {("a", 0): 0.5})
    assert one["low"] is None and comparison.format_difference(one) == "+10.00"
    same = comparison.compare_accuracies({("a", 0): 0.6, ("b", 0): 0.7}, {("a", 0): 0.5, ("b", 0): 0.6})
    assert same["low"] == pytest.approx(0.1) and same["high"] == pytest.approx(0.1)
    assert comparison.format_difference(same).endswith("*")
    none = comparison.compare_accuracies({("a", 0): 0.6}, {("b", 0): 0.5})
    assert none["clients"] == 0 and none["fedpeft"] is None and comparison.format_difference(none) == "—"


MODULES = ["m0", "m1", "m2"]


def test_rank_structures_are_counted_per_module_and_compared_on_shared_modules():
    # their model: 3 shared modules and a classifier, 4 ranks each, module-major as their scales are flattened
    theirs = comparison.scales_by_module(
        [
            0.9, 0.1, 0.1, 0.1,  # m0
            0.8, 0.7, 0.1, 0.1,  # m1
            0.1, 0.1, 0.1, 0.1,  # m2: ties at the floor go to the earlier module and rank
            0.95, 0.1, 0.1, 0.1,  # classifier
        ],
        ["base_model.model.m0", "base_model.model.m1", "base_model.model.m2", "base_model.model.classifier"],
    )  # fmt: skip
    assert list(theirs) == ["m0", "m1", "m2", "classifier"]
    restricted = comparison.restricted_counts(theirs, MODULES, budget=1)  # top 3 of the shared 12
    assert restricted == {"m0": 1, "m1": 2, "m2": 0}
    ours = comparison.kept_counts({"m0": np.array([0.5, 0.4, 0, 0]), "m1": np.array([0.3, 0, 0, 0]),
                                   "m2": np.zeros(4)}, budget=1)  # fmt: skip
    assert ours == {"m0": 2, "m1": 1, "m2": 0}
    agreement = comparison.compare_structures(ours, restricted)
    assert agreement == {"same": False, "overlap": pytest.approx(2 / 3)}
    assert comparison.compare_structures(ours, dict(ours)) == {"same": True, "overlap": 1.0}
    # what their run kept: the positions of the flat scales (patch 06), over all 4 modules (budget 1 -> 4 ranks)
    actual = comparison.module_counts([0, 4, 5, 12], ["m0", "m1", "m2", "classifier"], ranks_per_module=4)
    assert actual == {"m0": 1, "m1": 2, "m2": 0, "classifier": 1}
    assert comparison.outside_share(actual, MODULES) == pytest.approx(0.25)
    assert comparison.distinct([ours, dict(ours), restricted]) == 2
    # their budget-1 cut (4 of 16) falls between 0.7 and 0.1: no tie, nor the shared modules' (3 of 12); budget 2
    # over the shared modules (6 of 12) cuts through the 0.1s
    assert not comparison.tie_at_cut(theirs, 1)
    assert not comparison.tie_at_cut({name: theirs[name] for name in MODULES}, 1)
    assert comparison.tie_at_cut({name: theirs[name] for name in MODULES}, 2)
    assert not comparison.tie_at_cut({name: theirs[name] for name in MODULES}, 4)  # everything kept
    with pytest.raises(IndexError):
        comparison.module_counts([16], ["m0", "m1", "m2", "classifier"], ranks_per_module=4)
    with pytest.raises(ValueError, match="different sizes"):
        comparison.compare_structures(ours, {"m0": 1, "m1": 1, "m2": 0})
    with pytest.raises(KeyError):
        comparison.restricted_counts(theirs, ["m0", "mx"], budget=1)


def test_scales_are_clamped_and_their_module_means_correlated():
    ours = {"m0": np.array([-1.0, 1.0]), "m1": np.array([2.0, 2.0]), "m2": np.array([3.0, 5.0])}
    theirs = {"m0": np.array([0.0001, 0.0001]), "m1": np.array([0.5, 0.5]), "m2": np.array([1.0, 1.0])}
    found = comparison.compare_scales(ours, theirs, MODULES)
    our_means = [(1e-4 + 1.0) / 2, 2.0, 4.0]
    assert found["fedpeft_mean"] == pytest.approx(statistics.fmean(our_means))
    assert found["authors_mean"] == pytest.approx((1e-4 + 0.5 + 1.0) / 3)
    assert found["module_correlation"] == pytest.approx(np.corrcoef(our_means, [1e-4, 0.5, 1.0])[0, 1])
    flat = {"m0": np.ones(2), "m1": np.ones(2), "m2": np.ones(2)}
    assert comparison.compare_scales(flat, theirs, MODULES)["module_correlation"] is None
    assert comparison.mean_or_none([None, 0.5, float("nan"), 1.0]) == 0.75
    assert comparison.mean_or_none([None]) is None


def test_the_smoke_federation_is_the_exporters():
    tree = ast.parse((FOLDER / "export_federation.py").read_text())
    quick = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "QUICK" for t in node.targets)
    )
    assert tuple(quick) == compare.QUICK


@pytest.mark.parametrize(("protocol", "lr", "batch"), [("aligned", "0.005", "16"), ("authors", "0.0001", "32")])
def test_each_protocol_sets_the_same_numbers_on_both_sides(tmp_path, protocol, lr, batch):
    plan = {"protocol": protocol, "rounds": 3, "fraction": 0.5, "budgets": [2, 16], "federation": []}
    entries = {method: compare.fedpeft_entry(method, plan) for method in compare.METHODS}
    for entry in entries.values():
        assert compare.number(entry["lr"]) == lr and str(entry["batch_size"]) == batch
    assert entries["fedp2eft"]["rounds"] == 3 and entries["fedp2eft"]["psg_lr"] == 0.0001
    assert entries["bayestune_lora"]["r_init"] == compare.R_INIT == 32
    (tmp_path / "overrides.txt").write_text("simulation.num_clients=10\n")
    for method in compare.METHODS:
        line = compare.their_command(tmp_path, tmp_path, tmp_path, method, 52, plan, ["x=1"], "step")
        assert f"app.client.args.batch_size={batch}" in line
        lr_key = "app.client.args.task_lr" if method == "fedp2eft" else "app.on_evaluate.lr"
        assert f"{lr_key}={lr}" in line
        assert line[-2:] == ["x=1", "name=step"] and "seed=52" in line and "models.net.args.seed=52" in line
        assert line[2].endswith(compare.THEIR_CONFIG[method])
    # clients per round as fedpeft samples them: ceil(fraction x seen), at least 1
    assert compare.per_round({"fraction": 0.1}, 84) == 9 and compare.per_round({"fraction": 0.5}, 4) == 2
    assert compare.per_round({"fraction": 0.01}, 4) == 1


def test_flower_timestamps_give_round_and_evaluation_times(tmp_path):
    log = tmp_path / "step.log"
    log.write_text(
        "INFO:__main__:Run ID: x\n"
        "DEBUG flwr 2026-12-06 06:32:10,000 | llm_server.py:128 | fit_round 1: strategy sampled 2 clients (out of 10)\n"
        "DEBUG:flwr:fit_round 1: strategy sampled 2 clients (out of 10)\n"
        "DEBUG flwr 2026-12-06 06:32:13,500 | llm_server.py:142 | fit_round 1 received 2 results and 0 failures\n"
        "DEBUG flwr 2026-12-06 06:32:14,000 | llm_server.py:128 | fit_round 2: strategy sampled 2 clients (out of 10)\n"
        "DEBUG flwr 2026-12-06 06:32:16,000 | llm_server.py:142 | fit_round 2 received 2 results and 0 failures\n"
        "INFO flwr 2026-12-06 06:32:17,000 | llm_server.py:82 | configure_evaluate: strategy sampled 4 clients\n"
        "INFO flwr 2026-12-06 06:32:27,250 | llm_server.py:95 | aggregate_evaluate: received 4 results and 0 failures\n"
    )
    assert compare.flower_phases(log) == {"fit_s": 5.5, "rounds": 2, "evaluate_s": 10.2, "evaluated": 4}
    assert compare.flower_phases(tmp_path / "missing.log") == {}


def test_kept_steps_restore_a_run_folder_elsewhere_in_the_order_they_finished(tmp_path):
    """``run --keep``: each finished step's new and changed files go to ``<step>.tar.gz`` with its record; a run
    folder that lacks them takes them back (a later step's version of a shared file last) and skips those steps."""
    run, keep, elsewhere = tmp_path / "run", tmp_path / "keep", tmp_path / "elsewhere"
    (run / "fedpeft" / "lora").mkdir(parents=True)
    (run / "plan.json").write_text("{}")
    before = compare.snapshot(run)
    (run / "fedpeft" / "lora" / "results.jsonl").write_text("first\n")
    for unkept in ("adapters/lora/seed0/client-1/r2/adapter.safetensors", "checkpoints/lora/seed0.safetensors",
                   "plots/mean_seen.png", "parts/lora-seed0.jsonl"):  # fmt: skip
        (run / "fedpeft" / "lora" / "seed0" / unkept).parent.mkdir(parents=True)
        (run / "fedpeft" / "lora" / "seed0" / unkept).write_bytes(b"big")  # saved adapters: no step reads them
    (run / "fedpeft" / "lora" / "seed0" / "results.jsonl").write_text("kept\n")
    (run / "logs").mkdir()
    (run / "logs" / "a.log").write_text("a")
    compare.keep_step(keep, run, "a", before, {"wall_s": 1.0, "finished": "2026-12-07T10:00:00"})
    before = compare.snapshot(run)
    (run / "fedpeft" / "lora" / "results.jsonl").write_text("second\n")  # changed by the later step
    (run / "authors" / "models" / "b").mkdir(parents=True)
    (run / "authors" / "models" / "b" / "weights.pkl").write_bytes(b"\x00\x01")
    compare.keep_step(keep, run, "b", before, {"wall_s": 2.0, "finished": "2026-12-07T11:00:00"})
    with compare.tarfile.open(keep / "b.tar.gz") as archive:  # only what b wrote, not a's log or the plan
        assert sorted(archive.getnames()) == [
            "files/authors/models/b/weights.pkl",
            "files/fedpeft/lora/results.jsonl",
            "record.json",
        ]

    elsewhere.mkdir()
    steps = compare.Steps(elsewhere)
    assert compare.restore_steps(keep, elsewhere, steps) == ["a", "b"]
    assert (elsewhere / "fedpeft" / "lora" / "results.jsonl").read_text() == "second\n"
    assert (elsewhere / "authors" / "models" / "b" / "weights.pkl").read_bytes() == b"\x00\x01"
    assert (elsewhere / "logs" / "a.log").read_text() == "a"
    assert (elsewhere / "fedpeft" / "lora" / "seed0" / "results.jsonl").read_text() == "kept\n"
    assert not (elsewhere / "fedpeft" / "lora" / "seed0" / "adapters").exists()
    assert not (elsewhere / "fedpeft" / "lora" / "seed0" / "checkpoints").exists()
    assert not (elsewhere / "fedpeft" / "lora" / "seed0" / "plots").exists()
    assert compare.Steps(elsewhere).records["b"]["wall_s"] == 2.0  # saved to steps.json
    assert compare.restore_steps(keep, elsewhere, compare.Steps(elsewhere)) == []  # nothing twice


def test_fedpeft_start_up_is_the_mean_run_less_the_mean_phases_over_the_seeds():
    # Three seeds' runs of one method: walls 300, 200, 100 s; base stages 30 s; personalizations 230, 130, 40 s.
    steps = {f"fedpeft-lora-s{seed}": {"wall_s": wall} for seed, wall in enumerate((300.0, 200.0, 100.0))}
    costs = {
        "lora": [
            {"method": method, "seed": seed, "phase": phase, "metric": "wall_s", "value": value}
            for seed, personalization in enumerate((230.0, 130.0, 40.0))
            for method, phase, value in (("base", "base", 30.0), ("lora", "personalization", personalization))
        ]
    }
    plan = {"seeds": [0, 1, 2], "budgets": [2, 4, 8, 16], "methods": ["lora"], "fraction": 0.1}
    clients = [{"pool": "seen", "train": 50}, {"pool": "unseen", "train": 50}]
    lora = compare.estimate(plan, steps, costs, clients, rounds=60)["fedpeft"]["methods"]["lora"]
    # mean wall 200 s less the mean phases (30 + 133.3 s): 36.7 s of start-up, whichever seed ran last
    assert lora["startup_s"] == pytest.approx(200.0 - 30.0 - 400.0 / 3, abs=0.05)
    assert lora["base_stage_s"] == 30.0


def test_the_float32_variant_reruns_a_steps_own_command_on_its_patched_copy(tmp_path):
    variant = load("psg_float32")
    work, models = Path("/w/.work"), Path("/r/aligned/authors/models")
    log = tmp_path / "step.log"
    log.write_text(
        "INFO:__main__:Command ran: /w/.work/repo/main.py /w/.work/repo/configs/xnli/xnli_fedp2eft.yaml seed=42 "
        f"model_directory={models} app.args.load_fedl2p_params={models}/authors-fedp2eft-s42-federated/"
        "weights_round_60.pkl name=authors-fedp2eft-s42-r2-seen\nDEBUG flwr ...\n"
    )
    words = variant.retarget(variant.their_command(log), work, Path("/v/repo"), Path("/v/models"), models, 42)
    assert words == [
        "/v/repo/main.py",
        "/v/repo/configs/xnli/xnli_fedp2eft.yaml",
        "seed=42",
        "model_directory=/v/models",
        "app.args.load_fedl2p_params=/v/models/f32-fedp2eft-s42-federated/weights_round_60.pkl",
        "name=f32-fedp2eft-s42-r2-seen",
    ]
    # the patch changes the PSG's two casts and nothing else
    patch = (FOLDER / "variants" / "psg-float32.patch").read_text().splitlines()
    removed = [line for line in patch if line.startswith("-") and not line.startswith("---")]
    assert len(removed) == 4 and all("dtype=torch.bfloat16" in line for line in removed)
    silent = tmp_path / "silent.log"
    silent.write_text("nothing\n")
    with pytest.raises(SystemExit, match="does not say the command"):
        variant.their_command(silent)


def test_the_head_variant_gives_their_bayestune_lora_fedpeft_targets_as_their_config_reads_them():
    variant = load("head_variant")
    models = Path("/r/aligned/authors/models")
    words = [
        "/w/.work/repo/main.py",
        f"app.client.args.bt_args.load_bts_path={models}/authors-btlora-s42-r16-seen",
        f"model_directory={models}",
        "name=authors-btlora-s42-r2-seen",
    ]
    command = variant.retarget(words, Path("/v/models"), models, 42)
    assert command[:4] == [
        "/w/.work/repo/main.py",  # their code unchanged
        "app.client.args.bt_args.load_bts_path=/v/models/head-btlora-s42-r16-seen",
        "model_directory=/v/models",
        "name=head-btlora-s42-r2-seen",
    ]
    # their config.py splits an argument at its one "=" and reads the value with ast.literal_eval
    values = {}
    for argument in command[4:]:
        key, value = argument.split("=")
        values[key.rsplit(".", 1)[1]] = ast.literal_eval(value)
    assert values["modules_to_save"] == ["pooler", "classifier"]
    # PEFT matches a target by the module name's suffix: the encoder's linear layers, never the head
    bert = [
        "bert.encoder.layer.0.attention.self.query",
        "bert.encoder.layer.0.attention.self.key",
        "bert.encoder.layer.0.attention.self.value",
        "bert.encoder.layer.0.attention.output.dense",
        "bert.encoder.layer.0.intermediate.dense",
        "bert.encoder.layer.0.output.dense",
        "bert.pooler.dense",
        "classifier",
    ]
    adapted = [name for name in bert if any(name == t or name.endswith("." + t) for t in values["target_modules"])]
    assert adapted == bert[:6]
    # each pool's r = 16 step first: the scales the smaller budgets load
    assert variant.steps_of(["r2-seen", "r4-unseen", "r16-seen"], 42) == [
        "authors-btlora-s42-r16-seen",
        "authors-btlora-s42-r16-unseen",
        "authors-btlora-s42-r2-seen",
        "authors-btlora-s42-r4-unseen",
    ]
    assert variant.steps_of(["r2-seen"], 42, "fedp2eft") == [
        "authors-fedp2eft-s42-federated",
        "authors-fedp2eft-s42-r2-seen",
    ]
    # FedP2EFT's steps on the patched copy of their code: one cast to float32 before numpy, nothing else
    code = (Path("/w/.work/repo"), Path("/v/repo"))
    assert variant.retarget(words[:1], Path("/v/models"), models, 42, "fedp2eft", code)[0] == "/v/repo/main.py"
    patch = variant.PATCHES["fedp2eft"].read_text().splitlines()
    removed = [line for line in patch if line.startswith("-") and not line.startswith("---")]
    added = [line for line in patch if line.startswith("+") and not line.startswith("+++")]
    assert len(removed) == len(added) == 1
    assert added[0][1:].split("#")[0].rstrip() == removed[0][1:].replace(".cpu()", ".cpu().to(torch.float32)")
    assert variant.steps_of(["r2-seen"], 42, "lora") == ["authors-lora-s42-r2-seen"]  # nothing to load first
    assert variant.retarget(["name=authors-lora-s42-r2-seen"], Path("/v"), models, 42, "lora")[0] == (
        "name=head-lora-s42-r2-seen"
    )


def test_a_variant_pooled_over_seed_pairs_is_each_clients_mean_over_its_pairs(tmp_path):
    import json
    import pickle

    head = load("head_variant")  # puts the benchmark's folder on the path, as its command line does
    run = tmp_path / "aligned"
    (run / "federation").mkdir(parents=True)
    (run / "federation" / "clients.json").write_text(json.dumps(CLIENTS))
    seen = [row for row in CLIENTS if row["pool"] == "seen"]

    def theirs(folder: Path, name: str, values: list[float]) -> None:
        saved = folder / "authors" / "wandb" / name / "run0"
        saved.mkdir(parents=True)
        metrics = {f"client{row['cid']}_accuracy": v for row, v in zip(seen, values, strict=True)}
        (saved / "results.pkl").write_bytes(pickle.dumps({"server_metrics": metrics}))

    ours = {0: [0.70, 0.80, 0.60], 1: [0.72, 0.78, 0.66]}
    unchanged = {42: [0.60, 0.70, 0.50], 52: [0.64, 0.70, 0.56]}
    variant = {42: [0.69, 0.79, 0.61], 52: [0.70, 0.80, 0.62]}
    folders = {42: tmp_path / "v42", 52: tmp_path / "v52"}
    for seed, values in ours.items():
        out = run / "fedpeft" / "lora" / f"seed{seed}"
        out.mkdir(parents=True)
        rows = [record(row["client_id"], seed, v, method="lora") for row, v in zip(seen, values, strict=True)]
        (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for seed in (42, 52):
        theirs(run, f"authors-lora-s{seed}-r2-seen", unchanged[seed])
        theirs(folders[seed], f"head-lora-s{seed}-r2-seen", variant[seed])

    keys = ("head_minus_unchanged", "fedpeft_minus_head", "fedpeft_minus_unchanged")
    pairs = [(42, 0, folders[42]), (52, 1, folders[52])]
    (row,) = head.compare_pooled(run, pairs, "head", ("lora", "lora"), ["r2-seen"], keys)
    per_client = [
        (ours[0][i] - variant[42][i] + ours[1][i] - variant[52][i]) / 2 for i in range(len(seen))
    ]  # fedpeft - the variant, each client's mean over its two pairs
    assert row["fedpeft_minus_head"]["difference"] == pytest.approx(statistics.mean(per_client))
    assert row["fedpeft_minus_head"]["clients"] == 3 and row["fedpeft_minus_head"]["pairs"] == 6
    # one pair alone is compare_cells, the variant's own comparison
    (alone,) = head.compare_pooled(run, pairs[1:], "head", ("lora", "lora"), ["r2-seen"], keys)
    (cells,) = head.compare_cells(run, folders[52], "head", ("lora", "lora"), (52, 1), ["r2-seen"], keys)
    assert alone == cells
    assert alone["fedpeft_minus_unchanged"]["difference"] == pytest.approx(
        statistics.mean(o - u for o, u in zip(ours[1], unchanged[52], strict=True))
    )
