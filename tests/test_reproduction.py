"""`fedpeft compare`: a rerun against its reference run (fedpeft.report.reproduction)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from entry_point import cli, command_in_a_fresh_process

from fedpeft.core.errors import UserError
from fedpeft.report.intervals import Interval
from fedpeft.report.records import final_results, read_jsonl, results_file
from fedpeft.report.reproduction import compare_results, margin_sentence, record_shift, status_of

CLIENTS = [f"c{i}" for i in range(6)]
SEEDS = (0, 1)


def interval(low: float, high: float) -> Interval:
    return Interval((low + high) / 2, low, high, clients=6, pairs=12)


@pytest.mark.parametrize(
    ("before", "after", "status"),
    [
        ((0.01, 0.03), (0.02, 0.05), "holds"),
        ((-0.03, -0.01), (-0.05, -0.02), "holds"),
        ((0.01, 0.03), (-0.01, 0.03), "lost"),
        ((0.01, 0.03), (-0.04, -0.02), "reversed"),
        ((-0.01, 0.01), (0.01, 0.02), "new"),
        ((-0.01, 0.01), (-0.02, 0.01), "level"),
    ],
)
def test_status_of_each_pair_of_intervals(before, after, status):
    assert status_of(interval(*before), interval(*after)) == status


def records(values: dict[str, dict[tuple[str, int], float]]) -> list[dict]:
    """Final test records of one pool and metric: ``method -> (client, seed) -> value``."""
    return [
        {
            "method": method,
            "budget": None,
            "pool": "seen",
            "client": client,
            "group": "g0" if client < "c3" else "g1",
            "seed": seed,
            "round": None,
            "split": "test",
            "metric": "accuracy",
            "value": value,
        }
        for method, by_key in values.items()
        for (client, seed), value in by_key.items()
    ]


def spread(level: float, step: float = 0.01) -> dict[tuple[str, int], float]:
    """``level`` plus a client- and seed-dependent wobble, the same for every method given the same level."""
    return {(c, s): level + step * ((i * 7 + s * 3) % 5 - 2) / 4 for i, c in enumerate(CLIENTS) for s in SEEDS}


def shifted(values: dict[tuple[str, int], float], by: float) -> dict[tuple[str, int], float]:
    return {key: value + by for key, value in values.items()}


def noisy(values: dict[tuple[str, int], float], by: float) -> dict[tuple[str, int], float]:
    """``values`` with alternating clients moved up and down by ``by``: the mean stays, the spread grows."""
    return {(c, s): v + (by if int(c[1:]) % 2 else -by) for (c, s), v in values.items()}


def test_compare_sorts_every_pair_of_rows_and_names_the_best_rows():
    base, a, b, c = spread(0.50), spread(0.60), spread(0.55), spread(0.55)
    reference = records({"base": base, "a": a, "b": b, "c": c})
    # Rerun: b moves down into noise (no longer above base, nor below a), c overtakes a (a - c reverses).
    rerun = records({"base": base, "a": a, "b": noisy(shifted(b, -0.04), 0.2), "c": shifted(c, 0.10)})
    found = compare_results(reference, rerun)
    verdicts = {(v.method, v.other): v.status for v in found.verdicts}
    assert verdicts[("a", "base")] == "holds"  # untouched rows
    assert verdicts[("b", "base")] == "lost"
    assert verdicts[("a", "c")] == "reversed"
    assert verdicts[("a", "b")] == "lost"
    assert verdicts[("b", "c")] == "level"  # 0 for every client in the reference (b first on a tie), noise after
    assert verdicts[("c", "base")] == "holds"
    assert len(found.verdicts) == 6 and found.untested == 0
    # The reference's higher row comes first: every reference mean is >= 0.
    assert all(v.reference.mean >= 0 for v in found.verdicts)
    (top,) = found.tops
    assert (top.reference, top.rerun) == ("a", "c")
    assert top.supported  # a is bold in the reference: above b and c by the same margin for every client


def test_record_shift_counts_identical_records_and_names_the_largest_move():
    a = spread(0.60)
    moved = dict(a)
    moved["c4", 1] += 0.25
    moved["c0", 0] -= 0.01
    shift = record_shift(records({"a": a}), records({"a": moved, "b": a}))
    assert (shift.matched, shift.identical, shift.only_reference, shift.only_rerun) == (12, 10, 0, 12)
    assert shift.largest == pytest.approx(0.25)
    assert shift.largest_key == ("a", None, "seen", "c4", 1, "test", "accuracy")
    assert shift.median == 0 and shift.high == pytest.approx(0.01)
    assert shift.cell_largest == pytest.approx(0.24 / 12)  # the Mean cell over 6 clients and 2 seeds
    assert shift.seed_sd is not None and shift.seed_sd >= 0


def test_identical_runs_hold_every_supported_difference():
    values = records({"base": spread(0.5), "a": spread(0.6), "b": spread(0.6, step=0.03)})
    found = compare_results(values, values)
    assert found.shift.identical == found.shift.matched == 36
    assert found.count("holds") == sum(1 for v in found.verdicts if v.reference.excludes_zero) > 0
    assert found.count("lost") == found.count("reversed") == found.count("new") == 0


def test_results_are_read_from_a_directory_a_file_and_a_gzip_file(tmp_path):
    lines = [json.dumps(r) for r in records({"a": spread(0.6)})]
    # An earlier round of the same record is superseded by the later one, as in a run directory.
    early = {**json.loads(lines[0]), "round": 1, "value": 0.0}
    late = {**json.loads(lines[0]), "round": 3}
    text = "\n".join([json.dumps(early), json.dumps(late), *lines[1:]]) + "\n"
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text(text)
    (tmp_path / "results.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    found = [
        final_results(read_jsonl(results_file(p))) for p in (run, run / "results.jsonl", tmp_path / "results.jsonl.gz")
    ]
    assert found[0] == found[1] == found[2] and len(found[0]) == 12
    assert all(r["value"] != 0.0 for r in found[0])
    (tmp_path / "damaged.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(UserError, match="as gzip"):
        read_jsonl(results_file(tmp_path / "damaged.jsonl.gz"))


def write_run(path: Path, values: dict[str, dict[tuple[str, int], float]]) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(values)))
    return path


def test_compare_command_prints_and_writes_the_comparison(tmp_path, monkeypatch, capsys):
    reference = write_run(tmp_path / "reference", {"base": spread(0.5), "a": spread(0.6), "b": spread(0.55)})
    rerun = write_run(tmp_path / "rerun", {"base": spread(0.5), "a": spread(0.6), "b": shifted(spread(0.55), 0.1)})
    code, out, err = cli(monkeypatch, capsys, "compare", str(reference), str(rerun), "--out", str(tmp_path / "c.md"))
    assert code == 0, err
    text = (tmp_path / "c.md").read_text()
    assert "36 final test records in both runs" in text and "24 of them identical" in text
    assert "**2 of the 3 hold**" in text and "1 reversed" in text
    assert "| Seen pool — Accuracy | a − b | +5.00 [+5.00, +5.00] | -5.00 [-5.00, -5.00] | reversed |" in text
    assert "reversed" in out
    code, _, _ = cli(
        monkeypatch, capsys, "compare", str(reference), str(rerun), "--every-pair", "--out", str(tmp_path / "all.md")
    )
    assert code == 0 and "### Every pair" in (tmp_path / "all.md").read_text()


def test_compare_says_when_the_runs_used_other_vector_kernels(tmp_path, monkeypatch, capsys):
    values = {"base": spread(0.5), "a": spread(0.6)}
    reference, rerun = write_run(tmp_path / "reference", values), write_run(tmp_path / "rerun", values)
    for run, kernels in ((reference, "AVX512"), (rerun, "AVX2")):
        (run / "env.json").write_text(json.dumps({"cpu": {"model": "a CPU", "cores": 2, "kernels": kernels}}))
    code, out, err = cli(monkeypatch, capsys, "compare", str(reference), str(rerun), "--out", str(tmp_path / "c.md"))
    assert code == 0, err
    note = (
        "**Other vector kernels:** the reference ran on AVX512 kernels, the rerun on AVX2. Records computed with "
        "other kernels are not expected to be identical, so the comparison is of the intervals (the differences "
        "below), not of the digits."
    )
    assert note in (tmp_path / "c.md").read_text() and "Other vector kernels" in out
    (rerun / "env.json").write_text(json.dumps({"cpu": {"model": "a CPU", "cores": 2, "kernels": "AVX512"}}))
    code, out, _ = cli(monkeypatch, capsys, "compare", str(reference), str(rerun))
    assert code == 0 and "Other vector kernels" not in out


def test_compare_refuses_bad_input_with_one_sentence(tmp_path, monkeypatch, capsys):
    reference = write_run(tmp_path / "reference", {"a": spread(0.6)})
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.jsonl").write_text(
        "".join(json.dumps({**r, "pool": "unseen"}) + "\n" for r in records({"a": spread(0.6)}))
    )
    for args, message in [
        ((str(tmp_path / "missing"), str(reference)), "is neither a run directory"),
        ((str(reference), str(other)), "share no test record"),
        ((str(reference), str(reference), "--out", str(tmp_path)), "is a directory"),
    ]:
        code, out, err = cli(monkeypatch, capsys, "compare", *args)
        assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_compare_imports_no_torch(tmp_path):
    reference = write_run(tmp_path / "reference", {"base": spread(0.5), "a": spread(0.6)})
    assert command_in_a_fresh_process("compare", str(reference), str(reference)) == []


def test_margin_sentence_says_how_far_from_zero_the_lost_differences_lay():
    found = compare_results(
        records({"base": spread(0.5), "a": noisy(spread(0.6), 0.05), "b": noisy(spread(0.53), 0.005)}),
        records({"base": spread(0.5), "a": noisy(spread(0.6), 0.05), "b": noisy(spread(0.53), 0.05)}),
    )
    verdicts = {(v.method, v.other): v for v in found.verdicts}
    held, lost = verdicts["a", "base"], verdicts["b", "base"]
    assert held.status == "holds" and lost.status == "lost"
    half = (lost.reference.high - lost.reference.low) / 2
    assert lost.margin == pytest.approx(0.03 / half) and lost.margin > 1
    sentence = margin_sentence(found.verdicts)
    assert f"at most {lost.margin:.2f} half-widths" in sentence
    assert margin_sentence([v for v in found.verdicts if v.status == "level"]) == ""


def round_rows(values: dict[str, float], shift: dict[str, float] | None = None) -> list[dict]:
    """Per-round Self and Others records of 6 clients, 2 seeds and 3 rounds: ``method -> level`` (+ ``shift``
    at the last round only)."""
    rows = []
    for method, level in values.items():
        for (client, seed), value in spread(level).items():
            for round_ in (1, 2, 3):
                moved = (shift or {}).get(method, 0.0) if round_ == 3 else 0.0
                for split in ("test", "others"):
                    rows.append(
                        {
                            **records({method: {(client, seed): value + 0.01 * round_ + moved}})[0],
                            "split": split,
                            "round": round_,
                        }
                    )
    return rows


def test_compare_pairs_the_continual_tables_columns_too(tmp_path):
    before = round_rows({"a": 0.6, "b": 0.55})
    # b ahead by 0.07 at the last round only: a's 0.05 lead reverses there, and holds over the rounds (+0.01).
    after = round_rows({"a": 0.6, "b": 0.55}, shift={"b": 0.12})
    found = compare_results(final_results(before), final_results(after), before, after)
    statuses = {v.heading: v.status for v in found.verdicts if v.heading.startswith("Continual")}
    assert statuses == {
        "Continual, Self A_last — Accuracy": "reversed",
        "Continual, Self A_AUC — Accuracy": "holds",
        "Continual, Others A_last — Accuracy": "reversed",
        "Continual, Others A_AUC — Accuracy": "holds",
    }
    tops = {t.heading: (t.reference, t.rerun, t.supported) for t in found.tops}
    assert tops["Continual, Self A_last — Accuracy"] == ("a", "b", True)


def test_a_pair_of_rows_without_budget_is_compared_once_over_the_budgets_tables():
    rows = records({"base": spread(0.5), "a": spread(0.6)})
    budgeted = [{**r, "method": "m", "budget": budget} for budget in (2, 4) for r in records({"m": spread(0.55)})]
    found = compare_results(rows + budgeted, rows + budgeted)
    pairs = sorted((v.heading, v.method, v.other) for v in found.verdicts)
    # a - base in the r = 2 table only; m's own records differ by budget, so each table pairs them.
    assert pairs == [
        ("Seen pool, r = 2 — Accuracy", "a", "base"),
        ("Seen pool, r = 2 — Accuracy", "a", "m"),
        ("Seen pool, r = 2 — Accuracy", "m", "base"),
        ("Seen pool, r = 4 — Accuracy", "a", "m"),
        ("Seen pool, r = 4 — Accuracy", "m", "base"),
    ]
