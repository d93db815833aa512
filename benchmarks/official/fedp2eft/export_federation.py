"""Write a fedpeft federation and its base model in the layout the authors' FedP2EFT code reads.

The authors' XNLI pipeline (royson/fedp2eft, ``src/data/xnli_dataset.py``) reads one folder per client id,
``<dataset_fl_root>/xnli<k>_valratio0.0/<cid>/{train,test}.json``, each a ``datasets`` folder written by
``Dataset.save_to_disk`` with the columns ``premise``, ``hypothesis``, ``labels`` (0 entailment, 1 neutral,
2 contradiction) and ``language``; client ids run from 0 to ``simulation.num_clients - 1``. Its seen pool is the
first half of the ids and its unseen pool the second half; a fedpeft federation's pools may differ in size (in
``synthetic-xnli``, ``cyr1`` is in the unseen pool only), so the exporter also writes ``pools.json`` (each pool's
ids), which patches/03-pools-file.patch makes their code read. The base model is written as a Hugging Face
folder (weights, config naming the labels, tokenizer) that their ``model_name_or_path`` loads.

Written under ``--out``:

- ``model/``: the base model (by default the preset's: its tiny BERT, trained by its centralized base stage if it
  has one; ``--base-model DIR`` copies another Hugging Face folder instead, e.g. a fedpeft run's ``base_model/``);
- ``FL/xnli<k>_valratio0.0/``: the clients' folders and ``pools.json``;
- ``clients.json``: each exported id with its fedpeft client id, language, pool and sizes (to pair the two
  pipelines' per-client results);
- ``overrides.txt``: the ``key=value`` arguments of their ``main.py`` that point it at this federation.

Usage (in fedpeft's environment):
  python benchmarks/official/fedp2eft/export_federation.py --out runs/official-fedp2eft/federation
  python benchmarks/official/fedp2eft/export_federation.py --out /tmp/fed --set 'data.groups=[lat1,lat2,cyr1]' \
      --set data.clients_per_group=2 --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from fedpeft.core.config import ExperimentConfig
from fedpeft.data.types import ClientData, Example, FederatedData

LABEL_LIST = ("entailment", "neutral", "contradiction")
"""The authors' XNLI label order (``configs/xnli/xnli_fedp2eft.yaml``, ``config_args.label_list``)."""

PARTITIONS = ("train", "test")

QUICK = (
    "data.groups=[lat1,lat2,cyr1]",
    "data.clients_per_group=2",
    "data.train_per_group=120",
    "data.test_per_group=60",
)
"""``--quick``: 3 languages (``cyr1`` unseen only), 2 clients per language and pool (4 seen, 6 unseen), about 60
training and 30 test pairs per client; the base stage is the preset's."""


def federation_dir(root: Path, clients_per_language: int) -> Path:
    """The folder their ``XNLIDataset.get_fed_dir`` names for ``val_ratio: 0.0``."""
    return Path(root) / f"xnli{clients_per_language}_valratio0.0"


def ordered_clients(data: FederatedData) -> list[ClientData]:
    """The seen pool, then the unseen pool, each in the federation's order: the order of the exported ids."""
    return data.pool("seen") + data.pool("unseen")


def partition_columns(examples: list[Example], label_names: list[str], language: str) -> dict[str, list]:
    """One client's examples as the columns their XNLI code reads, labels renumbered to :data:`LABEL_LIST`."""
    unknown = sorted(set(label_names) - set(LABEL_LIST))
    if unknown:
        raise ValueError(f"labels {unknown} are not XNLI's {list(LABEL_LIST)}; only an XNLI-style federation exports")
    renumber = {index: LABEL_LIST.index(name) for index, name in enumerate(label_names)}
    return {
        "premise": [example["text"] for example in examples],
        "hypothesis": [example["text_pair"] or "" for example in examples],
        "labels": [renumber[int(example["label"])] for example in examples],
        "language": [language] * len(examples),
    }


def write_partitions(data: FederatedData, root: Path, clients_per_language: int) -> list[dict]:
    """Write every client's train and test split and ``pools.json`` under ``root`` (their ``dataset_fl_root``).

    Returns:
        One row per exported id: ``cid``, ``client_id``, ``language``, ``pool``, ``train``, ``test`` (sizes).
    """
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    if data.task != "classification" or not data.label_names:
        raise ValueError(f"{data.name} is not a classification federation; their XNLI pipeline reads pairs")
    target = federation_dir(root, clients_per_language)
    target.mkdir(parents=True, exist_ok=True)
    rows, pools = [], {"seen": [], "unseen": []}
    for cid, client in enumerate(ordered_clients(data)):
        for partition in PARTITIONS:
            columns = partition_columns(getattr(client, partition), data.label_names, client.group)
            Dataset.from_dict(columns).save_to_disk(str(target / str(cid) / f"{partition}.json"))
        pools[client.pool].append(cid)
        rows.append(
            {
                "cid": cid,
                "client_id": client.client_id,
                "language": client.group,
                "pool": client.pool,
                "train": len(client.train),
                "test": len(client.test),
            }
        )
    (target / "pools.json").write_text(json.dumps(pools) + "\n")
    return rows


def main_overrides(out: Path, rows: list[dict], clients_per_language: int, max_length: int) -> list[str]:
    """The ``key=value`` arguments of their ``main.py`` that make it read this federation and base model."""
    model = (out / "model").resolve()
    work = out.resolve()
    return [
        f"simulation.num_clients={len(rows)}",
        f"data.args.no_of_clients_per_language={clients_per_language}",
        f"data.args.path_to_data={work}",
        f"data.args.dataset_fl_root={work / 'FL'}",
        f"models.net.args.model_name_or_path={model}",
        f"models.net.args.cache_dir={work / 'cache'}",
        f"models.tokenizer.args.model_name_or_path={model}",
        f"models.tokenizer.args.cache_dir={work / 'cache'}",
        f"models.prompt.formatting_prompt_func.args.max_length={max_length}",
    ]


def export_model(cfg: ExperimentConfig, data: FederatedData, target: Path, base_stage: bool) -> None:
    """Build the config's model with fedpeft (its base stage too, if asked) and write it as a Hugging Face folder."""
    from fedpeft.base_models import train_centralized_base
    from fedpeft.worker import build_runtime, write_base_model

    runtime = build_runtime(cfg, data)
    if base_stage:
        train_centralized_base(runtime, data.base_train, cfg.base)
    write_base_model(runtime, runtime.base_tensors(), target, data.label_names)


def portable_tokenizer_config(model_dir: Path) -> None:
    """Name the tokenizer's class ``PreTrainedTokenizerFast`` (a tokenizer.json read as is): transformers 5 writes
    ``TokenizersBackend``, a name the transformers 4.44 of their pins does not know."""
    path = Path(model_dir) / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write (must not exist, or --force)")
    parser.add_argument("--preset", default="fedp2eft-xnli-cpu", help="fedpeft preset or YAML file")
    parser.add_argument("--set", action="append", default=[], help="fedpeft config override key=value (repeat)")
    parser.add_argument("--base-model", type=Path, help="copy this Hugging Face folder as the base model")
    parser.add_argument("--no-base-stage", action="store_true", help="export the model untrained")
    parser.add_argument("--quick", action="store_true", help="a tiny federation (QUICK)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)

    from fedpeft.core.config import load_config
    from fedpeft.worker import build_data

    overrides = list(args.set)
    if args.quick:
        overrides = [*QUICK, *overrides]
    cfg = load_config(args.preset, overrides)
    if args.out.exists():
        if not args.force:
            sys.exit(f"{args.out} exists; pass --force to replace it.")
        shutil.rmtree(args.out)
    torch.set_num_threads(max(1, cfg.threads or 1))
    data = build_data(cfg)
    clients_per_language = cfg.data.clients_per_group
    rows = write_partitions(data, args.out / "FL", clients_per_language)
    if args.base_model is not None:
        shutil.copytree(args.base_model, args.out / "model")
    else:
        base_stage = cfg.base.kind == "centralized" and not args.no_base_stage
        export_model(cfg, data, args.out / "model", base_stage)
    portable_tokenizer_config(args.out / "model")
    (args.out / "clients.json").write_text(json.dumps(rows, indent=1) + "\n")
    overrides_text = main_overrides(args.out, rows, clients_per_language, cfg.model.max_length)
    (args.out / "overrides.txt").write_text("\n".join(overrides_text) + "\n")
    seen = sum(row["pool"] == "seen" for row in rows)
    print(f"{len(rows)} clients ({seen} seen, {len(rows) - seen} unseen) and the base model written to {args.out}")
    return {"clients": rows, "overrides": overrides_text}


if __name__ == "__main__":
    main()
