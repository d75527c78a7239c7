"""The writing task and the paper's TLDR reward, level by level, with numbers worked by hand.

The summary below has 8 tokens, 8 distinct words (none a stopword) and 40 characters; the NATO
alphabet's words hold no transition phrase, not even inside a word, so only the words a test
adds reach the style level.
"""

from __future__ import annotations

import pytest

from cmlrl_env.writing_reward import STOPWORDS, TRANSITION_WORDS, content_measures
from cmlrl_env.writing_tasks import (
    WRITING_REWARD_MAX,
    expansion_formatter,
    summary_formatter,
    writing_levels,
    writing_reward,
    writing_splits,
)

SUMMARY = "one two three four five six seven eights"
NATO = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango victor whiskey xray yankee zulu"
).split()


def nato(k: int) -> str:
    return " ".join(NATO[:k])


def test_passages_split_nine_and_three_and_reach_the_formatters() -> None:
    train, evaluation = writing_splits()
    assert (len(train), len(evaluation)) == (9, 3)
    item = evaluation[0]
    assert item["prompt"] in summary_formatter(item) and item["prompt"] in expansion_formatter(item)
    assert set(train["prompt"]).isdisjoint(evaluation["prompt"])


def test_the_lexicon_is_the_papers() -> None:
    assert len(TRANSITION_WORDS) == 12 and len(STOPWORDS) == 106
    assert sum(map(len, TRANSITION_WORDS.values())) == 279
    assert TRANSITION_WORDS["time"][:3] == ("when", "while", "as")


def test_level_1_needs_8_to_256_whitespace_tokens_in_each_text() -> None:
    assert writing_levels("one two three four five six seven", nato(16)) == {"length_bounds": 0.0}
    assert writing_levels(SUMMARY, " ".join(["w"] * 257)) == {"length_bounds": 0.0}
    # Punctuation is a token too: 8 whitespace tokens, though ``\w+`` finds 7 words.
    assert writing_levels("one two three four five six seven .", nato(16))["length_bounds"] == 0.5
    # The bounds are a parameter: 2-4 tokens admit neither 8-token text.
    assert writing_reward([SUMMARY], [nato(16)], token_bounds=(2, 4)) == [0.0]
    with pytest.raises(ValueError, match=r"token_bounds must be .* got \(9, 3\)"):
        writing_reward([SUMMARY], [nato(16)], token_bounds=(9, 3))


def test_level_2_ramps_on_the_character_ratio_and_stops_outside_1_1_to_5() -> None:
    # 9 NATO words, 55 characters: r = 1.375, (1.375 - 1.1) / 0.5 = 0.55; 9 of 8 distinct
    # words is 1.125 < 1.3, so level 3 stops the reward.
    assert writing_levels(SUMMARY, nato(9)) == pytest.approx(
        {"length_bounds": 0.5, "length_ratio": 0.55, "vocabulary": 0.0}
    )
    # 22 words, 138 characters: r = 3.45, 1 - (3.45 - 3.2) / 1.8 = 0.86111; 22 / 8 distinct.
    assert writing_levels(SUMMARY, nato(22)) == pytest.approx(
        {
            "length_bounds": 0.5,
            "length_ratio": 1 - 0.25 / 1.8,
            "vocabulary": 0.5,
            "transitions": 0.0,
            "overlap": 0.0,
        }
    )
    # r = 201 / 40 > 5.0 and r = 41 / 40 < 1.1: the reward stops after level 2.
    too_long = " ".join(["abcdefghijklmnopqrs"] * 10) + "x"
    assert len(too_long) == 200
    assert writing_levels(SUMMARY, too_long + "y") == {"length_bounds": 0.5, "length_ratio": 0.0}
    assert writing_levels(SUMMARY, SUMMARY + "x") == {"length_bounds": 0.5, "length_ratio": 0.0}


def test_level_3_ramps_on_distinct_words_and_stops_below_1_3() -> None:
    # 12 words, 72 characters (r = 1.8): 12 / 8 = 1.5 distinct, (1.5 - 1.3) / 0.7 * 0.5.
    assert writing_levels(SUMMARY, nato(12))["vocabulary"] == pytest.approx(0.2 / 0.7 * 0.5)
    # Stopwords count here: 10 NATO words and "the" (75 characters) are 11 / 8 = 1.375.
    assert writing_levels(SUMMARY, nato(10) + " the the")["vocabulary"] == pytest.approx(
        0.075 / 0.7 * 0.5
    )
    # 10 / 8 = 1.25: the vocabulary level is 0.0 and the style level is never reached.
    assert "transitions" not in writing_levels(SUMMARY, nato(9) + " however")


def test_level_4_transitions_count_categories_as_substrings() -> None:
    # "however" is in two categories (contrast, concession): 0.4 * (0.4 + 0.05).
    assert writing_levels(SUMMARY, nato(16) + " however")["transitions"] == pytest.approx(0.18)
    # "was" holds "as" (time), the paper's substring test: 0.4 * 0.4.
    assert writing_levels(SUMMARY, nato(16) + " was")["transitions"] == pytest.approx(0.16)


def test_level_4_overlap_is_jaccard_without_stopwords_full_at_0_03() -> None:
    # "one" and w1..w26: 27 content words, 1 shared with the summary's 8: J = 1 / 34 < 0.03.
    expansion = "one " + " ".join(f"w{i}" for i in range(1, 27))
    assert len(expansion) == 98  # r = 2.45
    levels = writing_levels(SUMMARY, expansion)
    assert levels["overlap"] == pytest.approx(0.6 * (1 / 34) / 0.03)
    assert writing_reward([SUMMARY], [expansion]) == [pytest.approx(2.0 + 0.6 / 1.02)]
    # One shared word of 20 (J = 0.05) is past the cap: the full 0.6.
    assert writing_levels(SUMMARY, "one " + nato(15))["overlap"] == pytest.approx(0.6)
    # Two texts of stopwords only: both sets empty, J = 1.0 (the paper's rule).
    stop = "a all also an and any are as"
    assert writing_levels(stop, stop + " at be been being both but by can")["overlap"] == 0.6


def test_twelve_categories_and_shared_content_reach_the_reachable_maximum() -> None:
    # One phrase of each category; "one" shared (J = 1 / 20); 16 distinct words, r = 2.425.
    expansion = (
        "one also namely indeed thus but next overall equally though unless when "
        "alpha bravo charlie delta"
    )
    assert writing_levels(SUMMARY, expansion) == pytest.approx(
        {
            "length_bounds": 0.5,
            "length_ratio": 1.0,
            "vocabulary": 0.5,
            "transitions": 0.4 * 0.95,
            "overlap": 0.6,
        }
    )
    assert writing_reward([SUMMARY], [expansion])[0] == pytest.approx(2.98)
    assert WRITING_REWARD_MAX == 3.0


def test_content_measures_compare_each_text_with_the_passage() -> None:
    passage = "The council approved a new bridge over the river on Monday."
    summary = "Council approves the river bridge plan"  # content words: all but "the"
    expansion = "A new bridge over the river will open next year, the council said."
    measures = content_measures(summary, expansion, passage)
    assert measures == pytest.approx(
        {
            "summary_in_passage": 3 / 5,  # council, river, bridge
            "summary_longest_copy": 2.0,  # "the river"
            # content words ("a", "new", "the", "will" are stopwords): bridge, over, river,
            # open, next, year, council, said
            "expansion_in_passage": 4 / 8,
            "expansion_longest_copy": 6.0,  # "a new bridge over the river"
        }
    )
    assert content_measures("the a an", "", passage)["summary_in_passage"] == 0.0
