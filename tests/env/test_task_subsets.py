"""The experiment's task data: the HumanEval subset rule and split, the news passages, and the
single-agent writing pieces and writing eval hooks."""

from __future__ import annotations

import pytest

from cmlrl_env import code_tasks, writing_tasks
from cmlrl_env.code_tasks import _small


def test_the_small_humaneval_subset_is_the_rule_and_its_split_is_fixed() -> None:
    ids = code_tasks.humaneval_small_ids()
    assert len(ids) == 43
    assert ids[:5] == (
        "HumanEval/2",
        "HumanEval/13",
        "HumanEval/15",
        "HumanEval/16",
        "HumanEval/23",
    )
    train, evaluation = code_tasks.humaneval_small_splits()
    assert (len(train), len(evaluation)) == (29, 14)
    assert evaluation["task_id"] == list(ids[2::3])
    assert set(train["task_id"]) | set(evaluation["task_id"]) == set(ids)
    problems = code_tasks.humaneval_problems()
    assert all(_small(problems[t]) for t in ids)
    assert sum(_small(p) for p in problems.values()) == 43


@pytest.mark.parametrize(
    ("prompt", "solution", "small"),
    [
        ("def f(a, b):\n    '''doc'''\n", "    return a + b\n", True),
        ("def f(a, b, c):\n    '''doc'''\n", "    return a\n", False),  # 3 arguments
        ("def f(a):\n    '''doc'''\n", "    x = a\n    y = x\n    z = y\n    return z\n", False),
        ("import math\n\ndef f(a):\n    pass\n", "    return a\n", False),  # an import
        ("def f(a):\n    pass\n", "    import math\n    return a\n", False),
        ("def g(a):\n    pass\n\ndef f(a):\n    pass\n", "    return a\n", False),  # 2 defs
    ],
)
def test_the_subset_rule_by_hand_worked_problems(prompt: str, solution: str, small: bool) -> None:
    assert _small({"prompt": prompt, "canonical_solution": solution, "entry_point": "f"}) is small


def test_news_passages_are_each_article_lead_in_file_order() -> None:
    train, evaluation = writing_tasks.writing_news_splits()
    assert (len(train), len(evaluation)) == (300, 50)
    assert train[0]["prompt"] == (
        "Hundreds of people have been forced to vacate their homes in the Southern Highlands of "
        "New South Wales as strong winds today pushed a huge bushfire towards the town of Hill "
        "Top. A new blaze near Goulburn, south-west of Sydney, has forced the closure of the "
        "Hume Highway."
    )
    words = [len(p.split()) for p in list(train["prompt"]) + list(evaluation["prompt"])]
    assert (min(words), max(words)) == (24, 94)
    with pytest.raises(ValueError, match="lee_background.cor"):
        writing_tasks.news_passages("other.cor")


def test_the_sentence_rule_does_not_split_after_a_title() -> None:
    text = 'Mr. Smith said "Go." Then he left! Dr. Who stayed. The end'
    assert writing_tasks._SENTENCE_END.split(text) == [
        'Mr. Smith said "Go."',
        "Then he left!",
        "Dr. Who stayed.",
        "The end",
    ]


def test_one_agent_writing_both_texts_is_split_at_its_first_blank_line() -> None:
    summary = "one two three four five six seven eights"
    expansion = (
        "however alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima "
        "because mike then one"
    )  # 2 + 2 transition categories: 0.4 * 0.55; "one" shared (J = 1 / 24): the full 0.6
    assert writing_tasks.split_single_text(f"  {summary}\n\n{expansion}\n\nmore ") == (
        summary,
        f"{expansion}\n\nmore",
    )
    assert writing_tasks.split_single_text(summary) == (summary, "")
    for blank in ("\n \n", "\r\n\r\n", "\n\t\n"):  # a blank line holding spaces, or CRLF
        assert writing_tasks.split_single_text(f"{summary}{blank}{expansion}") == (
            summary,
            expansion,
        ), repr(blank)
    assert writing_tasks.writing_single_reward([f"{summary}\n\n{expansion}", summary]) == [
        pytest.approx(2.82),
        0.0,
    ]
    assert summary in writing_tasks.single_writing_formatter({"prompt": summary})


def test_the_writing_eval_hooks_give_each_items_reward_and_levels() -> None:
    summary = "one two three four five six seven eights"
    expansion = (
        "however alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima "
        "because mike then one"
    )  # 2 + 2 transition categories: 0.4 * 0.55; "one" shared (J = 1 / 24): the full 0.6
    rows = writing_tasks.writing_eval_logger(
        agent_completions_turns=[[[summary], ["short"]], [[expansion], ["x"]]],
        batch_items=[{"prompt": "one two three alpha bravo"}, {"prompt": "b"}],
    )
    assert rows[0]["turn_1/reward"] == pytest.approx(2.82)
    assert rows[0]["turn_1/level/transitions"] == pytest.approx(0.22)
    assert rows[0]["turn_1/content/summary_in_passage"] == 3 / 8
    assert rows[0]["turn_1/content/expansion_longest_copy"] == 2.0  # "alpha bravo"
    assert rows[1] == {
        "turn_1/reward": 0.0,
        "turn_1/level/length_bounds": 0.0,
        "turn_1/level/length_ratio": 0.0,
        "turn_1/level/vocabulary": 0.0,
        "turn_1/level/transitions": 0.0,
        "turn_1/level/overlap": 0.0,
        "turn_1/content/summary_in_passage": 0.0,
        "turn_1/content/summary_longest_copy": 0.0,
        "turn_1/content/expansion_in_passage": 0.0,
        "turn_1/content/expansion_longest_copy": 0.0,
    }
    single = writing_tasks.writing_eval_logger(
        agent_completions_turns=[[[f"{summary}\n\n{expansion}"]]], batch_items=[{"prompt": "a"}]
    )
    assert single[0]["turn_1/reward"] == pytest.approx(2.82)
    means = writing_tasks.writing_eval_aggregator(rows, num_turns=1)
    assert means["turn_1/reward"] == pytest.approx(1.41)
    with pytest.raises(ValueError, match="1 or 2 agents, got 3"):
        writing_tasks.writing_eval_logger(agent_completions_turns=[[], [], []], batch_items=[])
