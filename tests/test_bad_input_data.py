"""Data files in other encodings and data files that cannot be read: `fedpeft run` (the `files` dataset),
`fedpeft personalize --data` and `fedpeft report` refuse them with one sentence naming the file, the line or row
(and the byte offset of a byte that does not decode), exit code 2 and the user's files untouched; and what the
docs accept (other encodings through `data.encoding` / `--encoding`, a byte order mark, labels mixing class names
and ids, numbers in a text column) reads as it should."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import entry_point
import pandas as pd
import pytest
import yaml

from fedpeft.core.config import DataConfig
from fedpeft.core.registry import DATASETS
from fedpeft.data.types import FederatedData
from fedpeft.personalize import read_examples

CLIENTS = ("ana", "bo")


def rows() -> list[dict]:
    """Six rows for each of two clients, with accented text."""
    return [
        {"text": f"{client} café {i}", "label": "pos" if i % 2 else "neg", "client": client}
        for client in CLIENTS
        for i in range(6)
    ]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def csv_text(records: list[dict]) -> str:
    return "text,label,client\n" + "".join(f"{r['text']},{r['label']},{r['client']}\n" for r in records)


def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The ``fedpeft`` console entry point, in process; returns (exit code, stderr)."""
    code, _, err = entry_point.cli(monkeypatch, capsys, *args)
    return code, err


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_sentence(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for part in expected:
        assert part in err, (part, err)


def build(path: Path, **fields) -> FederatedData:
    return DATASETS.get("files")(DataConfig(name="files", path=str(path), **fields))


def texts_and_labels(fd: FederatedData) -> dict[str, str]:
    """Each example's text -> its label's name."""
    names = fd.label_names or []
    return {e["text"]: names[e["label"]] for c in fd.clients for e in c.train + c.test}


# ------------------------------------------------------------------------------------- `fedpeft run`: refusals


def _bad_byte_jsonl(folder: Path) -> Path:
    """A 546-line JSONL whose line 546 holds one byte that is not UTF-8."""
    many = [
        {"text": f"{c} review {i}", "label": "pos" if i % 3 else "neg", "client": c}
        for i in range(273)
        for c in CLIENTS
    ]
    head = jsonl(many[:-1]).encode("utf-8")
    (folder / "reviews.jsonl").write_bytes(
        head + b'{"text": "We waited an hour \xe0", "label": "neg", "client": "bo"}\n'
    )
    return folder / "reviews.jsonl"


def _latin1_csv(folder: Path) -> Path:
    (folder / "reviews.csv").write_bytes(csv_text(rows()).encode("latin-1"))
    return folder / "reviews.csv"


def _utf16_csv(folder: Path) -> Path:
    (folder / "reviews.csv").write_bytes(csv_text(rows()).encode("utf-16"))
    return folder / "reviews.csv"


def _utf16_without_mark(folder: Path) -> Path:
    (folder / "reviews.csv").write_bytes(csv_text(rows()).encode("utf-16-le"))
    return folder / "reviews.csv"


def _ragged_csv(folder: Path) -> Path:
    lines = csv_text(rows()).splitlines()
    lines[4] = "bo café, again,neg,bo"  # an unquoted comma: four fields
    (folder / "reviews.csv").write_text("\n".join(lines) + "\n")
    return folder / "reviews.csv"


def _list_line(folder: Path) -> Path:
    (folder / "reviews.jsonl").write_text(jsonl(rows()[:1]) + '["ana café", "pos", "ana"]\n' + jsonl(rows()[1:]))
    return folder / "reviews.jsonl"


def _list_text(folder: Path) -> Path:
    records = rows()
    records[3]["text"] = ["a", "list"]
    (folder / "reviews.jsonl").write_text(jsonl(records))
    return folder / "reviews.jsonl"


def _binary_parquet(folder: Path) -> Path:
    frame = pd.DataFrame(rows())
    frame["text"] = frame["text"].map(lambda t: t.encode("latin-1"))
    frame.to_parquet(folder / "reviews.parquet", index=False)
    return folder / "reviews.parquet"


def _id_out_of_range(folder: Path) -> Path:
    records = rows()
    records[7]["label"] = 5
    (folder / "reviews.jsonl").write_text(jsonl(records))
    return folder / "reviews.jsonl"


def _one_name_beside_ids(folder: Path) -> Path:
    records = [{**r, "label": "neg" if i == 0 else i % 2} for i, r in enumerate(rows())]
    (folder / "reviews.jsonl").write_text(jsonl(records))
    return folder / "reviews.jsonl"


RUN_CASES: list[tuple[Callable[[Path], Path], dict, tuple[str, ...]]] = [
    (_bad_byte_jsonl, {}, ("line 546 has a byte that is not valid utf-8 (0xe0 at byte offset", "set data.encoding")),
    (_latin1_csv, {}, ("line 2 has a byte that is not valid utf-8 (0xe9 at byte offset 25)", "set data.encoding")),
    (
        _utf16_csv,
        {},
        ("line 1 has a byte that is not valid utf-8 (0xff at byte offset 0", "set data.encoding to utf-16."),
    ),
    (
        _utf16_without_mark,
        {},
        ("line 2 has a byte that is not valid utf-8", "as UTF-16 text does", "set data.encoding to utf-16."),
    ),
    (_latin1_csv, {"encoding": "klingon"}, ("data.encoding 'klingon' is not an encoding Python knows",)),
    (_ragged_csv, {}, ("line 5 (row 4) has 4 fields where the header has 3; quote values that hold a comma",)),
    (_list_line, {}, ("line 2 is a list, not a JSON object",)),
    (_list_text, {}, ("Row 4 of", "has a list in column 'text', expected text")),
    (_binary_parquet, {}, ("Row 1 of", "has binary data in column 'text', expected text; store the column as UTF-8")),
    (_id_out_of_range, {}, ("Row 8 of", "has the label 5 in column 'label', which is not in the labels")),
    (
        _one_name_beside_ids,
        {},
        ("Row 1 of", "has the class name 'neg' in column 'label', the only one beside integer ids", "data.label_names"),
    ),
]


@pytest.mark.parametrize(
    ("make", "data", "expected"),
    RUN_CASES,
    ids=[case[0].__name__.strip("_") + ("-encoding" if case[1] else "") for case in RUN_CASES],
)
def test_run_refuses_a_bad_data_file_with_one_sentence(make, data, expected, tmp_path, monkeypatch, capsys) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    path = make(user)
    config = user / "my.yaml"
    config.write_text(
        yaml.safe_dump(
            {"name": "bad", "data": {"name": "files", "path": str(path), **data}, "model": {"name": "tiny-bert"}}
        )
    )
    before = snapshot(user)
    code, err = cli(monkeypatch, capsys, "run", str(config), "--out", str(tmp_path / "run"))
    assert_one_sentence(code, err, *expected)
    assert "encoding" in data or f"{path} " in err or f"of {path}" in err  # the sentence names the file
    assert snapshot(user) == before


# ------------------------------------------------------------------------------------------ `files`: accepted


def test_latin1_csv_reads_with_data_encoding(tmp_path: Path) -> None:
    path = _latin1_csv(tmp_path)
    got = texts_and_labels(build(path, encoding="latin-1"))
    assert got == {r["text"]: r["label"] for r in rows()}
    assert "ana café 0" in got


def test_utf16_csv_reads_with_data_encoding(tmp_path: Path) -> None:
    assert texts_and_labels(build(_utf16_csv(tmp_path), encoding="utf-16")) == {r["text"]: r["label"] for r in rows()}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"reviews{suffix}"
    body = csv_text(rows()) if suffix == ".csv" else jsonl(rows())
    path.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    fd = build(path)
    assert fd.info["columns"]["text"] == "text"
    assert texts_and_labels(fd) == {r["text"]: r["label"] for r in rows()}


def test_labels_mixing_names_and_ids_index_into_the_names(tmp_path: Path) -> None:
    expected = {r["text"]: r["label"] for r in rows()}
    ids = {"neg": 0, "pos": 1}
    mixed = [{**r, "label": ids[r["label"]] if i % 3 == 0 else r["label"]} for i, r in enumerate(rows())]
    (tmp_path / "mixed.jsonl").write_text(jsonl(mixed))
    fd = build(tmp_path / "mixed.jsonl")
    assert fd.label_names == ["neg", "pos"] and texts_and_labels(fd) == expected
    # With label_names the ids index into them, whatever order the names sort in.
    reversed_ids = [{**r, "label": 1 - ids[r["label"]] if i % 3 == 0 else r["label"]} for i, r in enumerate(rows())]
    (tmp_path / "reversed.jsonl").write_text(jsonl(reversed_ids))
    fd = build(tmp_path / "reversed.jsonl", label_names=["pos", "neg"])
    assert fd.label_names == ["pos", "neg"] and texts_and_labels(fd) == expected
    # A CSV holds the ids as digits.
    (tmp_path / "mixed.csv").write_text(csv_text(mixed))
    assert texts_and_labels(build(tmp_path / "mixed.csv")) == expected


def test_numbers_in_the_text_column_are_read_as_text(tmp_path: Path) -> None:
    records = rows()
    records[2]["text"] = 42
    records[3]["text"] = 2.5
    (tmp_path / "numbers.jsonl").write_text(jsonl(records))
    got = texts_and_labels(build(tmp_path / "numbers.jsonl"))
    assert got["42"] == records[2]["label"] and got["2.5"] == records[3]["label"]


# --------------------------------------------------------------------------- `fedpeft personalize --data`


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Enough of a run for `personalize` to read its --data file: a file of examples is read before the run's
    model and data are built."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: a-run\n")
    return run


PERSONALIZE_CASES = [
    (
        "latin1.csv",
        csv_text(rows()).encode("latin-1"),
        [],
        ("line 2 has a byte that is not valid utf-8 (0xe9 at byte offset 25)", "set --encoding to"),
    ),
    (
        "bad.jsonl",
        jsonl(rows()[:3]).encode() + b'{"text": "caf\xe9", "label": "pos"}\n',
        [],
        ("line 4 has a byte that is not valid utf-8 (0xe9 at byte offset", "set --encoding to"),
    ),
    ("list.jsonl", (jsonl(rows()[:2]) + '["ana", "pos"]\n').encode(), [], ("line 3 is a list, not a JSON object",)),
    ("ragged.csv", b"text,label\na,b,pos\n", [], ("line 2 (row 1) has 3 fields where the header has 2",)),
    ("mine.csv", csv_text(rows()).encode(), ["--encoding", "klingon"], ("--encoding 'klingon' is not an encoding",)),
]


@pytest.mark.parametrize(
    ("name", "content", "extra", "expected"), PERSONALIZE_CASES, ids=[c[0] for c in PERSONALIZE_CASES]
)
def test_personalize_refuses_a_bad_data_file_with_one_sentence(
    name, content, extra, expected, run_dir, tmp_path, monkeypatch, capsys
) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / name).write_bytes(content)
    before = snapshot(user)
    args = ["personalize", str(run_dir), "-r", "2", "--data", str(user / name), "--out", str(tmp_path / "out"), *extra]
    code, err = cli(monkeypatch, capsys, *args)
    assert_one_sentence(code, err, *((name,) if "--encoding" not in extra else ()), *expected)
    assert snapshot(user) == before
    assert not (tmp_path / "out").exists()


def test_personalize_reads_a_latin1_file_with_encoding(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_bytes(csv_text(rows()).encode("cp1252"))
    examples = read_examples(path, "cp1252")
    assert examples.columns == ["text", "label", "client"]
    assert [r["text"] for r in examples.rows] == [r["text"] for r in rows()]


# ---------------------------------------------------------------------------------------------- `fedpeft report`

RESULT = {
    "method": "base",
    "budget": None,
    "pool": "seen",
    "client": "ana",
    "group": "ana",
    "seed": 0,
    "split": "test",
    "metric": "accuracy",
    "value": 0.5,
    "round": None,
}


RESULT_LINE = json.dumps(RESULT).encode() + b"\n"
COST_LINE = b'{"method": "base", "seed": 0, "phase": "federated", "metric": "seconds", "value": 1}\n'
# (file, its bytes, what the sentence says)
REPORT_CASES = [
    (
        "results.jsonl",
        RESULT_LINE + json.dumps({**RESULT, "client": "b\xf6"}, ensure_ascii=False).encode("latin-1") + b"\n",
        ("results.jsonl line 2 has a byte that is not valid utf-8 (0xf6 at byte offset", "fix or remove that line"),
    ),
    (
        "costs.jsonl",
        COST_LINE + b"\xff\n",
        (f"costs.jsonl line 2 has a byte that is not valid utf-8 (0xff at byte offset {len(COST_LINE)})",),
    ),
    (
        "data.json",
        b'{"source": "reviews.csv",\n "task": "classification",\n "note": "\xe9"}\n',
        ("data.json line 3 has a byte that is not valid utf-8 (0xe9 at byte offset 63)", "rerun the run with --resume"),
    ),
    (
        "results.jsonl",
        RESULT_LINE + b"[1, 2]\n",
        ("results.jsonl line 2 is not a JSON object; fix or remove that line",),
    ),
]


@pytest.mark.parametrize(("name", "content", "expected"), REPORT_CASES, ids=["results", "costs", "data", "list"])
def test_report_refuses_an_undecodable_run_file_with_one_sentence(
    name, content, expected, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text(json.dumps(RESULT) + "\n")
    (run / name).write_bytes(content)
    before = snapshot(run)
    code, err = cli(monkeypatch, capsys, "report", str(run), "--out", str(tmp_path / "report"))
    assert_one_sentence(code, err, *expected)
    assert snapshot(run) == before
    assert not (tmp_path / "report").exists()  # the report's directory, created for it, is gone again
