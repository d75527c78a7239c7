"""The writing collaboration task: its passages, splits and gated levels, worked by hand."""

from __future__ import annotations

import pytest

from cmlrl_env.writing_tasks import (
    WRITING_REWARD_MAX,
    expansion_formatter,
    summary_formatter,
    writing_levels,
    writing_reward,
    writing_splits,
)

SUMMARY = "one two three four five six seven eights"  # 8 words, 8 distinct, 40 characters
NATO = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima"  # 12 words


def test_passages_split_nine_and_three_and_reach_the_formatters() -> None:
    train, evaluation = writing_splits()
    assert (len(train), len(evaluation)) == (9, 3)
    item = evaluation[0]
    assert item["prompt"] in summary_formatter(item) and item["prompt"] in expansion_formatter(item)
    assert set(train["prompt"]).isdisjoint(evaluation["prompt"])


def test_a_pair_at_every_optimum_scores_the_maximum() -> None:
    # 16 distinct words (ratio 2.0), 101 characters (ratio 2.525), three transition categories.
    expansion = f"however {NATO} because mike then"
    levels = writing_levels(SUMMARY, expansion)
    assert levels == {
        "length_bounds": 0.5,
        "length_ratio": 1.0,
        "vocabulary": 0.5,
        "transitions": 1.0,
    }
    assert writing_reward([SUMMARY], [expansion]) == [WRITING_REWARD_MAX]


def test_the_length_bounds_gate_stops_everything() -> None:
    assert writing_levels("too short", f"{NATO} mike november oscar papa") == {"length_bounds": 0.0}
    assert writing_levels(SUMMARY, "a b c") == {"length_bounds": 0.0}


def test_the_length_ratio_ramps_and_gates() -> None:
    short = " ".join(f"{c}{c}" for c in "abcdefghijklmnop")  # 16 distinct words, 47 characters
    # 47 / 40 = 1.175: (1.175 - 1.1) / 0.5 = 0.15 of level 2; 16 / 8 distinct words: full level 3.
    assert writing_levels(SUMMARY, short) == pytest.approx(
        {"length_bounds": 0.5, "length_ratio": 0.15, "vocabulary": 0.5, "transitions": 0.0}
    )
    long = " ".join(["abcdefghijklm"] * 15 + ["x" * 4])  # 15 * 14 + 4 = 214 characters
    assert writing_levels(SUMMARY, long) == {"length_bounds": 0.5, "length_ratio": 0.0}
    mid = " ".join(["abcdefghi"] * 16 + ["xxxxxx"])  # 16 * 10 + 6 = 166: ratio 4.15
    # (5.0 - 4.15) / (5.0 - 3.2) of level 2; 2 distinct words of 8: no vocabulary level.
    assert writing_levels(SUMMARY, mid) == pytest.approx(
        {"length_bounds": 0.5, "length_ratio": 0.85 / 1.8, "vocabulary": 0.0, "transitions": 0.0}
    )


def test_vocabulary_and_transitions_are_partial() -> None:
    # 14 distinct words of 16 (ratio 14 / 8 = 1.75): 0.5 * (1.75 - 1.3) / 0.7; one category of 3.
    expansion = f"{NATO} alpha bravo for example"
    levels = writing_levels(SUMMARY, expansion)
    assert levels == pytest.approx(
        {
            "length_bounds": 0.5,
            "length_ratio": 1.0,
            "vocabulary": 0.5 * 0.45 / 0.7,
            "transitions": 1 / 3,
        }
    )
