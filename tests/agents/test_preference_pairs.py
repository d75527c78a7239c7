"""Preference pairs: selection by reward gap, judges, the JSON-lines file (round trip, errors)."""

from __future__ import annotations

import json
import random

import pytest

from cmlrl_agents.algorithms.preference_pairs import (
    PairLabeler,
    PreferencePair,
    load_pairs,
    save_pairs,
    select_pairs,
)
from cmlrl_agents.runs.redaction import REDACTED

AGENTS = ["agent_0", "agent_1"]
REWARDS = [0.1, 0.5, 0.5, 0.0]
# Ordered pairs with a gap, in index order: (0,3) .1, (1,0) .4, (1,3) .5, (2,0) .4, (2,3) .5.


def test_reward_gap_keeps_the_largest_gaps_ties_in_index_order():
    got = select_pairs(REWARDS, "reward_gap", 3, random.Random(0))
    assert got == [(1, 3), (2, 3), (1, 0)]


def test_all_keeps_every_pair_with_a_gap_and_never_a_tie():
    got = select_pairs(REWARDS, "all", None, random.Random(0))
    assert got == [(0, 3), (1, 0), (1, 3), (2, 0), (2, 3)]
    assert select_pairs([0.3, 0.3, 0.3], "all", None, random.Random(0)) == []


def test_random_draws_from_the_pairs_with_a_gap_reproducibly():
    a = select_pairs(REWARDS, "random", 2, random.Random(7))
    b = select_pairs(REWARDS, "random", 2, random.Random(7))
    assert a == b and len(a) == 2
    assert set(a) <= {(0, 3), (1, 0), (1, 3), (2, 0), (2, 3)}


def test_a_preference_func_labels_every_unordered_pair():
    calls = []

    def longer(a, b, item):
        calls.append((a, b, item["id"]))
        return 1 if len(a[0]) > len(b[0]) else -1

    labeler = PairLabeler(selection="all", judge=longer, name="preference_func")
    joints = [("a", "x"), ("bb", "x"), ("ccc", "x")]
    assert labeler.label(joints, [0.0] * 3, {"id": 5}, "item 5") == [(1, 0), (2, 0), (2, 1)]
    assert len(calls) == 3 and calls[0] == (["a", "x"], ["bb", "x"], 5)


def test_a_tie_makes_no_pair():
    labeler = PairLabeler(selection="all", judge=lambda a, b, item: 0, name="preference_func")
    assert labeler.label([("a",), ("b",)], [0.0, 1.0], {}, "item 0") == []


@pytest.mark.parametrize("bad", [0.5, 2, "1", None, True])
def test_a_preference_func_returning_other_than_minus1_0_1_is_refused(bad):
    labeler = PairLabeler(selection="all", judge=lambda a, b, item: bad, name="preference_func")
    with pytest.raises(
        ValueError, match=r"preference_func returned .* for item 3; it must return 1"
    ):
        labeler.label([("a",), ("b",)], [0.0, 0.0], {}, "item 3")


def test_a_comparator_that_raises_is_named_and_its_key_redacted():
    secret = "sk-" + "a1b2c3d4" * 4

    def judge(a, b, item):
        raise ConnectionError(f"POST https://judge.example/v1?key={secret} refused")

    labeler = PairLabeler(selection="all", judge=judge, name="comparator HTTPJudge")
    with pytest.raises(ConnectionError) as err:  # the judge's own exception type, kept
        labeler.label([("a",), ("b",)], [0.0, 0.0], {}, "item 0")
    assert secret not in str(err.value) and REDACTED in str(err.value)
    assert "raised by the comparator HTTPJudge while judging item 0" in err.value.__notes__[0]


def test_reward_gap_with_a_judge_is_refused():
    with pytest.raises(ValueError, match="use pair_selection='all' or 'random'"):
        PairLabeler(selection="reward_gap", judge=lambda a, b, i: 1, name="preference_func")


def pair(**kw) -> PreferencePair:
    base = dict(prompts=("p0", "p1"), chosen=("good", "fine"), rejected=("bad", "meh"))
    return PreferencePair(**{**base, **kw})


def test_json_lines_round_trip(tmp_path):
    pairs = [
        pair(item={"prompt": "x", "n": 1}, item_index=0, chosen_reward=1.0, rejected_reward=0.0),
        pair(source="human"),
        pair(prompt_ids=((1, 2), (3,)), chosen_ids=((4, 2), (5, 2)), rejected_ids=((6,), (7,))),
    ]
    path = save_pairs(tmp_path / "pairs.jsonl", pairs, AGENTS)
    assert load_pairs(path, AGENTS) == pairs
    record = json.loads(path.read_text().splitlines()[0])
    assert record["chosen"] == {"agent_0": "good", "agent_1": "fine"}


def test_texts_with_unicode_line_separators_round_trip(tmp_path):
    # JSON leaves U+2028, U+2029 and U+0085 unescaped; only "\n" may end a line.
    pairs = [pair(chosen=("one\u2028two", "three\u2029four"), rejected=("five\x85six", "meh"))]
    assert load_pairs(save_pairs(tmp_path / "pairs.jsonl", pairs, AGENTS), AGENTS) == pairs


def test_a_hand_written_file_loads(tmp_path):
    line = {"prompts": {"agent_0": "a", "agent_1": "b"}, "chosen": {"agent_0": "c", "agent_1": "d"}}
    line["rejected"] = {"agent_0": "e", "agent_1": "f"}
    (tmp_path / "h.jsonl").write_text(json.dumps(line) + "\n\n")
    (loaded,) = load_pairs(tmp_path / "h.jsonl", AGENTS)
    assert loaded == PreferencePair(("a", "b"), ("c", "d"), ("e", "f"))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompts": {}, "chosen": {}}, r"line 1: missing field\(s\) \['rejected'\]"),
        (
            {
                "prompts": {"agent_0": "a", "agent_7": "b"},
                "chosen": {"agent_0": "a", "agent_1": "b"},
                "rejected": {"agent_0": "a", "agent_1": "b"},
            },
            r"'prompts' has unknown agents \['agent_7'\] and lacks \['agent_1'\]",
        ),
        ([1, 2], "each line must be a JSON object"),
    ],
)
def test_bad_pair_files_name_the_line_and_the_fix(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=message):
        load_pairs(path, AGENTS)


def test_not_json_empty_and_missing_files(tmp_path):
    (tmp_path / "x.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"x.jsonl line 1 is not JSON"):
        load_pairs(tmp_path / "x.jsonl", AGENTS)
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no pairs"):
        load_pairs(tmp_path / "e.jsonl", AGENTS)
    with pytest.raises(FileNotFoundError, match="check pairs_file"):
        load_pairs(tmp_path / "missing.jsonl", AGENTS)


def test_an_llm_judge_is_antisymmetric_and_matches_its_log_probs():
    from cmlrl_agents.algorithms.preference_judge import LLMJudge
    from cmlrl_agents.testing import tiny_agent

    agent = tiny_agent(seed=3)
    judge = LLMJudge(agent)
    a, b, item = ["short", "long answer"], ["x", "y"], {"prompt": "Describe"}
    assert judge(a, b, item) == -judge(b, a, item) != 0
    assert judge.margin(a, b, item) == pytest.approx(-judge.margin(b, a, item), abs=1e-6)
    # By hand from the agent's own scoring of the answers "A" and "B".
    prompts = agent.encode_prompts([judge.prompt(a, b, item), judge.prompt(b, a, item)])
    rows = [prompts[0], prompts[0], prompts[1], prompts[1]]
    answers = [judge.label_ids[0], judge.label_ids[1]] * 2
    lp = agent.logprobs(rows, answers).sum(dim=1).tolist()
    assert judge.margin(a, b, item) == pytest.approx((lp[0] - lp[1]) - (lp[2] - lp[3]), abs=1e-5)
    labeler = PairLabeler(selection="all", judge=judge, name="comparator LLMJudge")
    assert labeler.label([tuple(a), tuple(b)], [0.0, 0.0], item, "item 0") in ([(0, 1)], [(1, 0)])


def test_an_llm_judges_instruction_names_its_labels():
    from cmlrl_agents.algorithms.preference_judge import DEFAULT_INSTRUCTION, LLMJudge
    from cmlrl_agents.testing import tiny_agent

    agent = tiny_agent(seed=3)
    assert LLMJudge(agent).instruction == DEFAULT_INSTRUCTION
    assert DEFAULT_INSTRUCTION.endswith("Reply with A or B.")
    judged = LLMJudge(agent, labels=("Yes", "No"))
    assert judged.instruction.endswith("Reply with Yes or No.")
    assert judged.prompt(["a"], ["b"], None).startswith(judged.instruction)
    assert LLMJudge(agent, instruction="Pick one.").instruction == "Pick one."
