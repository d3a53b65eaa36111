"""The grouping of similar lines (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from regency._logs._aggregate import Aggregator, edit_distance_below, format_timestamp, similar


def _levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
        previous = current
    return previous[-1]


words = st.text(alphabet="abc ", max_size=14)


@given(words, words, st.integers(0, 10))
def test_banded_distance_matches_the_full_one(a: str, b: str, limit: int) -> None:
    distance = _levenshtein(a, b)
    assert edit_distance_below(a, b, limit) == (distance if distance < limit else None)


@given(words, words)
def test_similar_is_normalized_distance_below_threshold(a: str, b: str) -> None:
    longest = max(len(a), len(b))
    assert similar(a, b, 0.3) == (longest == 0 or _levenshtein(a, b) / longest < 0.3)


def test_groups_across_and_within_ranks_per_first_line() -> None:
    agg = Aggregator()
    for rank in (0, 1, 2):
        for step in (1, 2):
            agg.add(rank, f"step {step} of the epoch finished on rank {rank}", 1.0)
    agg.add(1, "checkpoint written to /tmp/ckpt", 2.0)
    assert [(g.count, g.rank, g.line) for g in agg.groups] == [
        (6, 0, "step 1 of the epoch finished on rank 0"),
        (1, 1, "checkpoint written to /tmp/ckpt"),
    ]
    text = agg.render()
    lines = text.splitlines()
    assert lines[0] == "\x1b[36m>>> Aggregated Logs (t=1.000000) >>>\x1b[0m"
    assert lines[1] == "\x1b[33m[6 similar log lines]\x1b[0m [0] step 1 of the epoch finished on rank 0"
    assert lines[2] == "\x1b[33m[1 similar log lines]\x1b[0m [1] checkpoint written to /tmp/ckpt"
    assert lines[3] == "\x1b[36m<<< Aggregated Logs (t=1.000000) <<<\x1b[0m"
    agg.reset()
    assert agg.render() == ""


def test_threshold_is_strict() -> None:
    # 3 edits over 20 characters is exactly 0.15: not similar (Monarch: "< 0.15").
    assert not similar("a" * 20, "a" * 17 + "bbb")
    assert similar("a" * 20, "a" * 18 + "bb")


def test_wall_clock_timestamps_print_as_utc() -> None:
    assert format_timestamp(1_700_000_000.25) == "2023-11-14 22:13:20.250"
