"""benchmarks/official/fedp2eft/export_federation.py writes a federation in the layout the authors' XNLI code reads:
one ``datasets`` folder per client id and split, their columns and label order, the seen pool first, and
``pools.json`` for pools of unequal sizes. Checked on a hand-made federation, without the authors' code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from datasets import load_from_disk

from fedpeft.data.types import ClientData, FederatedData

EXPORTER = Path(__file__).resolve().parent.parent / "benchmarks" / "official" / "fedp2eft" / "export_federation.py"


def exporter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("official_fedp2eft_export", EXPORTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pair(text: str, label: int, group: str) -> dict:
    return {"text": f"{text} p", "text_pair": f"{text} h", "label": label, "group": group}


def federation(label_names: list[str]) -> FederatedData:
    """Two languages; ``bb`` in the unseen pool only, so the pools differ in size (1 seen, 3 unseen). The
    unseen clients come first in the list, to check that the export puts the seen pool first."""

    def client(client_id: str, group: str, pool: str, labels: list[int]) -> ClientData:
        train = [pair(f"{client_id} train {i}", label, group) for i, label in enumerate(labels)]
        return ClientData(client_id, group, pool, train, [pair(f"{client_id} test", labels[0], group)])

    clients = [
        client("aa-unseen-00", "aa", "unseen", [2, 2]),
        client("aa-seen-00", "aa", "seen", [0, 1, 2]),
        client("bb-unseen-00", "bb", "unseen", [1]),
        client("bb-unseen-01", "bb", "unseen", [0, 0]),
    ]
    return FederatedData("tiny-nli", "classification", label_names, ["aa", "bb"], clients)


def test_export_writes_each_client_as_their_xnli_code_reads_it(tmp_path):
    module = exporter()
    # fedpeft's label order differs from the authors' here: the labels are renumbered by name
    data = federation(["neutral", "entailment", "contradiction"])
    rows = module.write_partitions(data, tmp_path, clients_per_language=1)

    root = tmp_path / "xnli1_valratio0.0"  # XNLIDataset.get_fed_dir with val_ratio 0.0
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2", "3", "pools.json"]
    assert json.loads((root / "pools.json").read_text()) == {"seen": [0], "unseen": [1, 2, 3]}
    assert [(r["cid"], r["client_id"], r["pool"], r["language"]) for r in rows] == [
        (0, "aa-seen-00", "seen", "aa"),
        (1, "aa-unseen-00", "unseen", "aa"),
        (2, "bb-unseen-00", "unseen", "bb"),
        (3, "bb-unseen-01", "unseen", "bb"),
    ]
    assert [(r["train"], r["test"]) for r in rows] == [(3, 1), (2, 1), (1, 1), (2, 1)]

    seen_train = load_from_disk(str(root / "0" / "train.json"))
    assert seen_train.column_names == ["premise", "hypothesis", "labels", "language"]
    # fedpeft's 0 (neutral), 1 (entailment), 2 (contradiction) -> XNLI's 1, 0, 2
    assert seen_train["labels"] == [1, 0, 2]
    assert seen_train["premise"][0] == "aa-seen-00 train 0 p" and seen_train["hypothesis"][0] == "aa-seen-00 train 0 h"
    assert set(seen_train["language"]) == {"aa"}
    for cid, row in enumerate(rows):
        for split in ("train", "test"):
            assert len(load_from_disk(str(root / str(cid) / f"{split}.json"))) == row[split]


def test_export_refuses_labels_other_than_xnli_s(tmp_path):
    with pytest.raises(ValueError, match="not XNLI's"):
        exporter().write_partitions(federation(["positive", "negative", "neutral"]), tmp_path, 1)


def test_overrides_point_their_main_at_the_federation_and_model(tmp_path):
    module = exporter()
    rows = [{"cid": i} for i in range(4)]
    overrides = dict(line.split("=", 1) for line in module.main_overrides(tmp_path, rows, 2, 48))
    assert overrides["simulation.num_clients"] == "4"
    assert overrides["data.args.no_of_clients_per_language"] == "2"
    assert overrides["data.args.dataset_fl_root"] == str(tmp_path.resolve() / "FL")
    assert overrides["models.net.args.model_name_or_path"] == str(tmp_path.resolve() / "model")
    assert overrides["models.tokenizer.args.model_name_or_path"] == str(tmp_path.resolve() / "model")
    assert overrides["models.prompt.formatting_prompt_func.args.max_length"] == "48"


def test_tokenizer_config_names_a_class_transformers_4_knows(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend", "x": 1}))
    exporter().portable_tokenizer_config(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {"tokenizer_class": "PreTrainedTokenizerFast", "x": 1}
