"""One paper preset of each family rehearsed end to end at a cut size (`fedpeft run PRESET --rehearse`; every
family, ``HERE``): stand-in data through the real loader, a random-weight stand-in of the paper
model at true width (one layer), every phase, the report, `--resume`. What a rehearsal at the presets' own size
measured is in docs/results/paper-scale.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedpeft.report.records import REHEARSAL_NOTE

CUT = ["rehearse.layers=1", "rehearse.rounds=1", "rehearse.batch_size=1", "rehearse.new_tokens=1", "engine.workers=1"]

# Per family: the preset, what cuts it further (fewer groups or methods), and the clients the federation has then.
FAMILIES = {
    "fedp2eft": (
        "fedp2eft-masakhanews",
        [
            "data.groups=[hau, yor]",
            "data.clients_per_group=2",
            "data.train_per_group=40",
            "data.test_per_group=8",
            "budgets=[2]",
            "methods=[{name: lora, epochs: 2, batch_size: 4}, "
            "{name: fedp2eft, rounds: 150, fraction: 0.1, batch_size: 4}]",
        ],
        8,
    ),
    "potara": (
        "potara-cifar100",
        [
            "data.options.num_clients=4",
            "data.train_per_group=40",
            "data.test_per_group=8",
            "methods=[{name: local, rounds: 300, local_steps: 5, batch_size: 10, rank: 8, targets: [q_proj, v_proj]}, "
            "{name: potara, rounds: 400, local_rounds: 300, local_steps: 5, batch_size: 10, rank: 8, "
            "merge_samples: 4, targets: [q_proj, v_proj]}]",
        ],
        4,
    ),
    "flame": ("flame-alpagasus", ["methods=[{name: flame}, {name: hetlora}]"], 4),
    "guidance": (
        "guidance-sni",
        [
            "data.options.train_per_client=20",
            "methods=[{name: guided, label: fedavg-ab, rounds: 20, fraction: 1.0, local_epochs: 1, batch_size: 32, "
            "rank: 8, targets: [q_proj, v_proj], merge: {operator: mean, space: ab}}]",
        ],
        10,
    ),
    "fedmosaic": (
        "fedmosaic-hflb",
        [
            "data.options.train_per_task=4",
            "data.options.test_per_task=2",
            "data.base_samples=8",
            "methods=[{name: fedmosaic, rank: 16}]",
        ],
        9,
    ),
}


def rehearse(preset: str, out, overrides: list[str], *more: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fedpeft.cli", "run", preset, "--rehearse", "--out", str(out), *more]
    for assignment in overrides:
        command += ["--set", assignment]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Stand-ins of this module's rehearsals (data, models), never ~/.cache."""
    return tmp_path_factory.mktemp("fedpeft-cache")


# The families the suite rehearses, all five: FedP2EFT's (an encoder, hundreds of clients' worth of phases),
# Guidance's (a Llama 3 with generation), Potara's (ViT-B/16 on stand-in CIFAR-100 pictures, Potara's merge from
# per-sample gradients; its text preset at Llama-3.2-3B's width took 61 s: rehearse that with `fedpeft run
# potara-commonsense --rehearse`), FLAME's (OLMoE's 64 experts) and FedMosaic's (two LLaVA at true width, the
# alignment of their adapter frames: FedMosaic alone, FedIT's rounds being every other family's).
HERE = ("fedp2eft", "guidance", "potara", "flame", "fedmosaic")
# The families whose finished rehearsal is resumed too (a process more each): hundreds of clients' state on disk,
# and two architectures' (the resume is the same code for every family).
RESUMED = ("fedp2eft", "fedmosaic")


@pytest.mark.slow
@pytest.mark.parametrize("family", HERE)
def test_a_paper_preset_rehearses_end_to_end(family, tmp_path, cache, monkeypatch):
    rehearses_end_to_end(family, tmp_path, cache, monkeypatch)


def rehearses_end_to_end(family: str, tmp_path, cache, monkeypatch) -> None:
    """Rehearse the family's preset at its cut size and check every output, then (:data:`RESUMED`) resume it."""
    monkeypatch.setenv("FEDPEFT_CACHE", str(cache))
    preset, extra, clients = FAMILIES[family]
    measure = family == "fedp2eft"  # the per-depth step once: two more processes
    overrides = [*CUT, *extra, f"rehearse.measure_steps={str(measure).lower()}"]
    out = tmp_path / preset
    done = rehearse(preset, out, overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"Rehearsal of {preset}" in done.stdout and "not results" in done.stdout

    summary = json.loads((out / "rehearsal.json").read_text())
    assert summary["rehearse"]["models"] and all(summary["rehearse"]["models"].values())
    assert summary["rehearse"]["data"] and "stand-in" in summary["rehearse"]["data"]
    methods = {row["method"] for row in summary["phases"]}
    assert methods - {"base"} and all(row["wall_s"] >= 0 for row in summary["phases"])
    if measure:
        (step,) = summary["steps"]
        assert [d["layers"] for d in step["depths"]] == [1, 2] and step["true_layers"] == 12
        assert step["full_step_s"] > 0 and step["per_layer_mb"] is not None
        # what its batches held: mBERT's examples of at most 256 tokens, one label each (no logits over words)
        assert all(0 < d["positions"] <= 256 and d["logit_share"] == 1.0 for d in step["depths"])
        # at the preset's length, and at the rehearsal's own batch and length, at the depth it ran, for the plan of
        # the rehearsal config itself
        assert step["length"] == 256 and (step["cut"]["batch_size"], step["cut"]["length"]) == (1, 32)
        assert [d["layers"] for d in step["cut"]["depths"]] == [1]

    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tested = {r["client"] for r in records if r["split"] == "test" and r["client"]}
    assert len(tested) == clients  # every client of the federation evaluated
    text = (out / "summary.md").read_text()
    assert REHEARSAL_NOTE in text and "## Headline" not in text

    if family not in RESUMED:
        return
    before = sorted((out / "results.jsonl").read_text().splitlines())
    again = rehearse(preset, out, overrides, "--resume")  # a finished rehearsal resumes to nothing new
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted((out / "results.jsonl").read_text().splitlines()) == before
