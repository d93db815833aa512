"""95 % intervals of paired differences (clients as the unit): golden numbers, bold and Wins only where the interval
lies above 0, the summary's differences section and headline, and the CSV columns, on hand-made records."""

from __future__ import annotations

import csv
import io
import math
import statistics

import pytest
from scipy import stats
from test_report import result, write_run

from fedpeft.report import group_table, read_records, render_csv, render_group_table, write_summary
from fedpeft.report.differences import comparisons, gain_intervals
from fedpeft.report.intervals import Interval, client_differences, format_interval, paired_interval, t_interval

GROUPS = {"c0": "g1", "c1": "g1", "c2": "g1", "c3": "g2", "c4": "g2", "c5": "g2"}
# (client, seed) -> value of a method M and its reference R. c2 lacks seed 1 in R and c5 is not in R at all: only
# the pairs both have count. Per-client mean differences over seeds: c0 (.10 + .14) / 2 = .12, c1 (.02 + .06) / 2
# = .04, c2 .20 (seed 0 only), c3 (-.02 + .02) / 2 = 0, c4 (.08 + .12) / 2 = .10.
METHOD = {
    ("c0", 0): 0.60, ("c0", 1): 0.64, ("c1", 0): 0.52, ("c1", 1): 0.56, ("c2", 0): 0.70, ("c2", 1): 0.71,
    ("c3", 0): 0.48, ("c3", 1): 0.52, ("c4", 0): 0.58, ("c4", 1): 0.62, ("c5", 0): 0.90,
}  # fmt: skip
REFERENCE = {
    ("c0", 0): 0.50, ("c0", 1): 0.50, ("c1", 0): 0.50, ("c1", 1): 0.50, ("c2", 0): 0.50,
    ("c3", 0): 0.50, ("c3", 1): 0.50, ("c4", 0): 0.50, ("c4", 1): 0.50,
}  # fmt: skip
PER_CLIENT = {"c0": 0.12, "c1": 0.04, "c2": 0.20, "c3": 0.0, "c4": 0.10}


def expected_t_interval(values: list[float]) -> tuple[float, float]:
    """mean +- t(0.975, n - 1) sd / sqrt(n), written out."""
    n = len(values)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return statistics.fmean(values) - half, statistics.fmean(values) + half


# ---------------------------------------------------------------------------------------------- the interval


def test_clients_are_the_unit_seeds_averaged_first():
    found = client_differences(METHOD, REFERENCE)
    assert found.keys() == PER_CLIENT.keys()
    for client, difference in PER_CLIENT.items():
        assert found[client] == pytest.approx(difference)
    assert client_differences(METHOD, REFERENCE, clients=["c3", "c4", "c5"]).keys() == {"c3", "c4"}


def test_golden_t_interval_over_clients():
    interval = paired_interval(METHOD, REFERENCE)
    low, high = expected_t_interval(list(PER_CLIENT.values()))
    assert interval is not None
    assert interval.mean == pytest.approx(0.092)  # (.12 + .04 + .20 + 0 + .10) / 5
    assert (interval.low, interval.high) == (pytest.approx(low), pytest.approx(high))
    # By hand: sd = sqrt(.02368 / 4) = .0769415, t(0.975, 4) = 2.776445 -> half width .0955355.
    assert (interval.low, interval.high) == (pytest.approx(-0.0035355, abs=1e-6), pytest.approx(0.1875355, abs=1e-6))
    assert interval.clients == 5 and interval.pairs == 9
    assert not interval.excludes_zero and not interval.above_zero
    # One group: c0, c1, c2 (t with 2 degrees of freedom).
    group = paired_interval(METHOD, REFERENCE, clients=["c0", "c1", "c2"])
    assert group is not None and group.clients == 3
    assert (group.low, group.high) == tuple(map(pytest.approx, expected_t_interval([0.12, 0.04, 0.20])))


def test_one_client_has_no_interval_and_no_spread_a_point():
    one = paired_interval({("c0", 0): 0.7}, {("c0", 0): 0.5})
    assert one == Interval(pytest.approx(0.2), None, None, 1, 1)
    assert not one.excludes_zero and format_interval(one) == "+20.00"
    assert t_interval([0.1, 0.1, 0.1]) == (pytest.approx(0.1), pytest.approx(0.1))
    assert paired_interval({("c0", 0): 0.7}, {("c1", 0): 0.5}) is None  # nothing paired
    assert format_interval(None) == "—"
    assert format_interval(Interval(0.123, 0.101, 0.146, 5, 10)) == "+12.30 [+10.10, +14.60]"


def test_more_clients_narrow_the_interval():
    widths = []
    for copies in (1, 2, 4):  # the same spread of differences, on more clients
        values, reference = {}, {}
        for copy in range(copies):
            for client, difference in PER_CLIENT.items():
                values[f"{client}-{copy}", 0] = 0.5 + difference
                reference[f"{client}-{copy}", 0] = 0.5
        interval = paired_interval(values, reference)
        assert interval is not None and interval.low is not None and interval.high is not None
        assert interval.low < interval.mean < interval.high
        widths.append(interval.high - interval.low)
    assert widths[0] > widths[1] > widths[2]


# ---------------------------------------------------------------------------------------------- bold and Wins


def table_records(offsets: dict[str, dict[str, float]], noise: dict[str, tuple[float, ...]]) -> list[dict]:
    """Records of base (0.5) and methods at r = 4 over the clients of GROUPS and seeds 0, 1: a method's value is
    0.5 + its offset in the client's group + its noise on the client (by index) + 0.01 on seed 1."""
    records = [result("base", None, c, seed, 0.5, group=group) for c, group in GROUPS.items() for seed in (0, 1)]
    for method, by_group in offsets.items():
        for index, (client, group) in enumerate(GROUPS.items()):
            for seed in (0, 1):
                value = 0.5 + by_group[group] + noise[method][index] + 0.01 * seed
                records.append(result(method, 4, client, seed, value, group=group))
    return records


CLEAR = table_records(
    {"A": {"g1": 0.30, "g2": 0.20}, "B": {"g1": 0.10, "g2": 0.10}},
    {"A": (0.01, -0.01, 0.0, 0.02, 0.0, -0.02), "B": (0.0,) * 6},
)  # A is 20 and 10 points above B on every client of g1 and g2, give or take 2: a clear winner
OVERLAPPING = table_records(
    {"A": {"g1": 0.12, "g2": 0.10}, "B": {"g1": 0.10, "g2": 0.10}},
    {"A": (0.10, -0.08, 0.0, 0.09, -0.10, 0.03), "B": (0.0,) * 6},
)  # A is 2 and 0.33 points above B on average, but its clients spread by 10 either way


def test_a_clear_winner_is_bold_and_wins():
    table = group_table(CLEAR, pool="seen", metric="accuracy", budget=4)
    assert table.best == table.bold == {"g1": {"A"}, "g2": {"A"}, "Mean": {"A"}}
    assert table.wins == {"A": 2, "B": 0}
    reference, interval = table.against["A", "g1"]
    assert reference == "B" and interval.clients == 3
    low, high = expected_t_interval([0.31 - 0.10, 0.29 - 0.10, 0.30 - 0.10])
    assert (interval.low, interval.high) == (pytest.approx(low), pytest.approx(high)) and interval.low > 0
    lines = render_group_table(table).splitlines()
    assert lines[3] == "| A | **80.50 ± 0.71** | **70.50 ± 0.71** | **75.50 ± 0.71** | 2 |"
    assert lines[4] == "| B | 60.50 ± 0.71 | 60.50 ± 0.71 | 60.50 ± 0.71 | 0 |"


def test_overlapping_methods_have_a_best_mean_but_no_bold_and_no_wins():
    table = group_table(OVERLAPPING, pool="seen", metric="accuracy", budget=4)
    assert table.best == {"g1": {"A"}, "g2": {"A"}, "Mean": {"A"}}  # the highest mean, as the headline names it
    assert table.bold == {"g1": set(), "g2": set(), "Mean": set()}
    assert table.wins == {"A": 0, "B": 0}
    _, interval = table.against["A", "Mean"]
    assert interval.low is not None and interval.low < 0 < interval.mean
    assert "**" not in render_group_table(table)


def test_a_tie_is_never_bold():
    records = [r for r in CLEAR if r["method"] != "A"]
    records += [{**r, "method": "C"} for r in records if r["method"] == "B"]  # C = B on every client and seed
    table = group_table(records, pool="seen", metric="accuracy", budget=4)
    assert table.best["g1"] == {"B", "C"} and table.bold["g1"] == set() and table.wins == {"B": 0, "C": 0}


# ---------------------------------------------------------------------------------------------- summary.md


def test_summary_shows_the_differences_with_intervals_after_the_gain_over_base(tmp_path):
    run = write_run(tmp_path / "run", CLEAR)
    text = write_summary([run], tmp_path / "out")
    assert text.index("## Gain over base") < text.index("## Differences with 95 % intervals") < text.index("## Results")
    results, _ = read_records([run])
    table = group_table(results, pool="seen", metric="accuracy", budget=4)
    over_base, over_other = [(c.over_base, c.over_best_other) for c in comparisons(table) if c.method == "A"][0]
    assert over_base is not None and over_other is not None and over_other.clients == 6
    section = text.split("## Differences with 95 % intervals")[1].split("\n## ")[0]
    assert "### Seen pool, r = 4 — Accuracy" in section
    assert "| Method | Mean | − base [95 % CI] | n | Best other | − best other [95 % CI] | n |" in section
    assert f"| A | 75.50 ± 0.71 | {format_interval(over_base)} | 6 | B | {format_interval(over_other)} | 6 |" in section
    assert "| B | 60.50 ± 0.71 | +10.50 [+10.50, +10.50] | 6 | A | -15.00 [" in section
    low, high = expected_t_interval([0.21, 0.19, 0.20, 0.12, 0.10, 0.08])
    assert format_interval(over_other) == f"+15.00 [{low * 100:+.2f}, {high * 100:+.2f}]"
    headline = text.split("## Headline\n\n")[1].split("\n## ")[0]
    assert (
        "**95 % intervals** (x100, paired differences over the pool's clients, n clients; a difference is supported "
        f"where its interval excludes 0): r = 4: A over B {format_interval(over_other)} (n = 6), over base "
        f"{format_interval(over_base)} (n = 6)." in headline
    )
    assert "| A | **80.50 ± 0.71** | **70.50 ± 0.71** | **75.50 ± 0.71** | 2 |" in text.split("## Results")[1]


def test_one_seed_has_intervals_over_clients_but_a_thin_table_marks_no_winner(tmp_path):
    one_seed = [r for r in CLEAR if r["seed"] == 0]
    text = write_summary([write_run(tmp_path / "run", one_seed)], tmp_path / "out")
    section = text.split("## Differences with 95 % intervals")[1].split("\n## ")[0]
    assert "| A | 75.00 | " in section and "| 6 | B | +15.00 [" in section  # the interval exists on one seed
    assert "Over that seed's clients the 95 % intervals support r = 4: A minus B +15.00 [" in text
    assert "the seed's own draw, which moves every client together, is not in these intervals" in text
    tables = text.split("\n## Seen pool\n")[1]
    assert "**" not in tables and "| A | 80.00 | 70.00 | 75.00 | 2 |" in tables  # Wins (n.s.): by the intervals


# ---------------------------------------------------------------------------------------------- CSV


def test_csv_has_the_difference_its_bounds_and_the_reference_per_row():
    rows = list(csv.DictReader(io.StringIO(render_csv(CLEAR))))
    assert list(rows[0])[-5:] == ["reference", "difference", "low", "high", "clients"]
    cell = next(r for r in rows if r["table"] == "results" and (r["method"], r["column"]) == ("A", "g1"))
    low, high = expected_t_interval([0.21, 0.19, 0.20])
    assert cell["reference"] == "B" and cell["best"] == "1" and cell["clients"] == "3"
    assert float(cell["difference"]) == pytest.approx(20.0)
    assert (float(cell["low"]), float(cell["high"])) == (pytest.approx(low * 100), pytest.approx(high * 100))
    behind = next(r for r in rows if r["table"] == "results" and (r["method"], r["column"]) == ("B", "Mean"))
    assert behind["reference"] == "A" and float(behind["difference"]) == pytest.approx(-15.0)
    base = next(r for r in rows if r["table"] == "results" and r["method"] == "base")
    assert [base[k] for k in ("reference", "difference", "low", "high", "clients")] == [""] * 5
    gain = next(r for r in rows if r["table"] == "gain" and r["method"] == "A")
    interval = gain_intervals(CLEAR, pool="seen", metric="accuracy")["A", 4]
    assert gain["reference"] == "base" and gain["clients"] == "6"
    assert float(gain["difference"]) == pytest.approx(float(gain["mean"]))  # every client on every seed
    assert interval.low is not None and interval.high is not None and interval.low > 0
    bounds = (pytest.approx(interval.low * 100), pytest.approx(interval.high * 100))
    assert (float(gain["low"]), float(gain["high"])) == bounds
    overlapping = list(csv.DictReader(io.StringIO(render_csv(OVERLAPPING))))
    assert {r["best"] for r in overlapping if r["table"] == "results"} == {"0"}
    assert all(float(r["low"]) < 0 for r in overlapping if r["table"] == "results" and r["reference"] == "B")


def test_the_interval_is_scipys_one_sample_t_interval():
    import random

    rng = random.Random(7)
    for n in (2, 3, 5, 12, 40):
        values = [rng.gauss(0.05, 0.1) for _ in range(n)]
        found = stats.ttest_1samp(values, 0.0).confidence_interval(confidence_level=0.95)
        low, high = t_interval(values)
        assert (low, high) == (pytest.approx(float(found.low), rel=1e-12), pytest.approx(float(found.high), rel=1e-12))
