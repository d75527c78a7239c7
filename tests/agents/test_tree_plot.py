"""The rollout-tree picture: numbers worked by hand, the PNG, the HTML's full texts, the trainer's
saved trees (numbers and loss equal to the update's) and ``cmlrl plot``."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pytest
import torch
from datasets import Dataset

from cmlrl_agents import (
    MAGRPOConfig,
    MAGRPOTrainer,
    ScriptedLLMAgent,
    ScriptedPolicy,
    TreeView,
    draw_rollout_tree,
    rollout_tree_view,
    save_rollout_tree,
    write_tree_html,
)
from cmlrl_agents.cli.commands import main
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.functional.losses import policy_gradient_loss
from cmlrl_agents.learning.credit import (
    advantage_scale,
    agent_returns,
    agent_rows,
    batch_stds,
    joint_returns,
    return_moments,
)
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.runs import tree_plot as tree_plot_module
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import Task

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SAMPLING = SamplingConfig(max_new_tokens=4)
TAIL = "\nline two of a long answer " + "x" * 150


def script(name: str):
    """Turn 1: ``<name><g> & co``; turn 2 (the prompt is agent 0's answer): prompt|<name><g>,
    agent 1 adding a long multi-line tail that a snippet cannot show."""

    def answer(prompt: str, g: int) -> str:
        if prompt == "root":
            return f"{name}<{g}> & co"
        return f"{prompt}|{name}{g}" + (TAIL if name == "B" else "")

    return answer


REWARDS = {"A<0> & co": 0.95, "A<1> & co": 0.1, "A<1> & co|A0": 0.2, "A<1> & co|A1": 0.6}


def reward(c1, c2):
    return [REWARDS[text] for text in c1]


def next_prompt(prompt, agent_completions, num_agents, **history):
    return [agent_completions[0]] * num_agents


def two_turn_tree(joint_mode: str = "aligned"):
    task = Task(
        None,
        reward,
        num_agents=2,
        num_turns=2,
        external_transition=next_prompt,
        early_termination_threshold=0.9,
    )
    agents = [ScriptedPolicy(script("A")), ScriptedPolicy(script("B"))]
    items = [({"prompt": "root"}, 7), ({"prompt": "root"}, 8)]
    return collect_tree(task, agents, items, num_generations=2, sampling=SAMPLING)


def test_view_numbers_by_hand():
    # "A<0>" reaches 0.95 > 0.9 and ends early; "A<1>" (0.1) goes on to 0.2 and 0.6.
    # discount 0.5: R("A<1>") = 0.1 + 0.5 * (0.2 + 0.6) / 2 = 0.3; the ended branch keeps its
    # reward for its unplayed turn: R("A<0>") = 0.95 + 0.5 * 0.95 = 1.425.
    # Mean baseline, no std scaling: turn 1: 1.425 - 0.8625 = +0.5625, 0.3 - 0.8625 = -0.5625;
    # turn 2: 0.2 - 0.4 = -0.2, 0.6 - 0.4 = +0.2 (aligned: both agents get the same).
    tree = two_turn_tree()
    view = rollout_tree_view(
        tree, item_slot=1, discount=0.5, advantage_mode="mean", advantage_normalization=False
    )
    assert view.item_index == 8 and view.num_turns == 2 and view.num_leaves == 3
    got = [
        (n.id, n.parent, n.turn, n.completions[0], n.reward, n.turn_return, n.ended_early)
        for n in view.nodes
    ]
    assert got == [
        (0, None, 1, "A<0> & co", 0.95, pytest.approx(1.425), True),
        (1, None, 1, "A<1> & co", 0.1, pytest.approx(0.3), False),
        (2, 1, 2, "A<1> & co|A0", 0.2, pytest.approx(0.2), False),
        (3, 1, 2, "A<1> & co|A1", 0.6, pytest.approx(0.6), False),
    ]
    expected = [0.5625, -0.5625, -0.2, 0.2]
    for node, adv in zip(view.nodes, expected, strict=True):
        assert node.advantages == (pytest.approx(adv), pytest.approx(adv))
    assert view.nodes[2].prompts == ("A<1> & co", "A<1> & co")
    assert view.root_prompts == ("root", "root")


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
@pytest.mark.parametrize(
    "mode,normalize", [("mean", True), ("mean", "batch"), ("rloo", False), ("max", "none")]
)
def test_view_advantages_are_the_ones_the_trainer_trains_on(joint_mode, mode, normalize):
    task = Task(
        None,
        lambda c1, c2: [len(a) + 2 * len(b) for a, b in zip(c1, c2, strict=True)],
        num_agents=2,
    )
    agents = [ScriptedPolicy(lambda p, g: "x" * (g + 1)), ScriptedPolicy(lambda p, g: "y" * g)]
    tree = collect_tree(
        task,
        agents,
        [({"prompt": "p"}, 0)],
        num_generations=3,
        sampling=SAMPLING,
        joint_mode=joint_mode,
    )
    view = rollout_tree_view(tree, advantage_mode=mode, advantage_normalization=normalize)
    returns = agent_returns(tree, joint_returns(tree, 1.0))
    # One item, one turn: the round's std is over this tree's returns.
    stds = batch_stds(return_moments(returns, 2, 1), 2, 1) if normalize == "batch" else [None] * 2
    for a in range(2):
        trained = {
            s.completion_ids: s.advantage
            for s in agent_rows(tree, a, returns, mode, advantage_scale(normalize), stds[a])
        }
        for node in view.nodes:
            ids = tuple(ord(c) for c in node.completions[a])
            assert node.advantages[a] == pytest.approx(trained[ids], abs=1e-6)
    assert len(view.nodes) == (3 if joint_mode == "aligned" else 9)


class _TreeHTML(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[dict[str, str]] = []
        self.pres: list[tuple[str, str, str]] = []  # (class, agent, text)
        self._pre: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "li":
            self.nodes.append(attrs)
        if tag == "pre":
            self._pre = [attrs["class"], attrs["data-agent"], ""]
        for value in attrs.values():
            assert not (value or "").startswith(("http:", "https:")), "external resource"
        assert tag not in {"script", "link", "img"}

    def handle_data(self, data):
        if self._pre is not None:
            self._pre[2] += data

    def handle_endtag(self, tag):
        if tag == "pre" and self._pre is not None:
            self.pres.append(tuple(self._pre))
            self._pre = None


def test_png_and_html_hold_the_tree(tmp_path):
    view = rollout_tree_view(two_turn_tree(), discount=0.5, advantage_normalization=False)
    png, page = draw_rollout_tree(view, tmp_path / "sub" / "tree.png")
    assert page == tmp_path / "sub" / "tree.html"
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    parser = _TreeHTML()
    parser.feed(page.read_text("utf-8"))
    completions = [(agent, text) for kind, agent, text in parser.pres if kind == "completion"]
    expected = [(str(a), text) for n in view.nodes for a, text in enumerate(n.completions)]
    assert sorted(completions) == sorted(expected)  # every full text, escapes undone
    assert any(text.endswith("x" * 150) for _, text in completions)
    assert len(parser.nodes) == len(view.nodes)
    for attrs, node in zip(parser.nodes, view.nodes, strict=True):
        assert int(attrs["data-node"]) == node.id and int(attrs["data-turn"]) == node.turn
        assert float(attrs["data-reward"]) == node.reward
        assert float(attrs["data-return"]) == node.turn_return
        assert tuple(json.loads(attrs["data-advantages"])) == node.advantages
        assert ("ended" in attrs["class"].split()) == node.ended_early
    assert "&lt;0&gt; &amp; co" in page.read_text("utf-8")


def test_a_rolloutree_can_be_drawn_directly_and_html_skipped(tmp_path):
    png, page = draw_rollout_tree(two_turn_tree(), tmp_path / "t.png", html_output=False)
    assert page is None and png.read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "t.html").exists()


def test_json_round_trip_and_bad_files(tmp_path):
    view = rollout_tree_view(two_turn_tree(), env_step=12)
    paths = save_rollout_tree(view, tmp_path / "env_step-000012")
    assert sorted(paths) == ["html", "json", "png"]
    assert TreeView.load(paths["json"]) == view
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list, not a rollout-tree view"):
        TreeView.load(tmp_path / "bad.json")
    data = view.to_dict()
    del data["nodes"][0]["reward"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"node 0: missing keys \['reward'\]"):
        TreeView.load(tmp_path / "bad.json")


def test_bad_arguments_name_the_fix(tmp_path, monkeypatch):
    tree = two_turn_tree()
    with pytest.raises(ValueError, match=r"item_slot=2 but the tree holds 2 items; pass 0 to 1"):
        rollout_tree_view(tree, item_slot=2)
    with pytest.raises(ValueError, match="advantage_mode must be one of"):
        rollout_tree_view(tree, advantage_mode="median")
    with pytest.raises(TypeError, match="view must be a TreeView"):
        draw_rollout_tree("tree.json", tmp_path / "t.png")
    with pytest.raises(ValueError, match="snippet_chars must be an int >= 4, got 2"):
        draw_rollout_tree(tree, tmp_path / "t.png", snippet_chars=2)
    monkeypatch.setattr(tree_plot_module, "MAX_PNG_LEAVES", 2)
    with pytest.raises(ValueError, match="the tree has 3 leaves, more than MAX_PNG_LEAVES=2"):
        draw_rollout_tree(tree, tmp_path / "t.png")
    paths = tree_plot_module.save_rollout_tree(rollout_tree_view(tree), tmp_path / "big")
    assert sorted(paths) == ["html", "json"]  # too big for a PNG: the HTML holds it all
    assert write_tree_html(rollout_tree_view(tree), tmp_path / "x.html").is_file()


# -- the trainer ------------------------------------------------------------------------------


def brief(prompt: str, g: int) -> str:
    return "Hi."


DETAILED = ("Hello.", "Hello there, my friend.")


def detailed(prompt: str, g: int) -> str:
    return DETAILED[g]


def ratio_reward(c1, c2):
    # 6 / 3 = 2 is inside [2, 3]: 1.0; 23 / 3 = 7.67 is 4.67 above 3: exp(-4.67)
    return [
        math.exp(-max(0.0, len(b) / len(a) - 3.0, 2.0 - len(b) / len(a)))
        for a, b in zip(c1, c2, strict=True)
    ]


def scripted_trainer(tmp_path, items: int, **config):
    tokenizer = tiny_tokenizer()
    agents = [
        ScriptedLLMAgent(s, tiny_model(len(tokenizer), seed), tokenizer)
        for seed, s in enumerate((brief, detailed))
    ]
    args = MAGRPOConfig(
        num_generations=2,
        rollout_buffer_size=1,
        eval_interval=0,
        logging_steps=1,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
        **config,
    )
    data = Dataset.from_dict({"prompt": [f"task {i}" for i in range(items)]})
    return MAGRPOTrainer(agents=agents, reward_func=ratio_reward, train_dataset=data, args=args)


def test_scripted_llm_agent_answers_with_real_token_ids():
    tokenizer = tiny_tokenizer()
    agent = ScriptedLLMAgent(detailed, tiny_model(len(tokenizer)), tokenizer)
    (row,) = agent.generate(["task 0"], 2)
    assert [c.text for c in row] == ["Hello.", "Hello there, my friend."]
    assert row[0].prompt_ids == tuple(agent.encode_prompts(["task 0"])[0])
    assert row[0].completion_ids[-1] == tokenizer.eos_token_id and row[0].finished
    assert tokenizer.decode(row[1].completion_ids, skip_special_tokens=True) == row[1].text


def test_trainer_saves_every_nth_tree_with_the_numbers_of_its_update(tmp_path):
    trainer = scripted_trainer(tmp_path, items=4, tree_plot_interval=3)
    trainer.train()  # four rounds of one item: the trees of rounds 1 and 4
    trees = trainer.run_dir / "trees"
    assert sorted(p.name for p in trees.iterdir()) == [
        f"env_step-{s:06d}.{ext}" for s in (0, 6) for ext in ("html", "json", "png")
    ]
    assert trainer.rounds == 4
    # R = [1, exp(-4.67)]; A = (R - mean) / (std_pop + 1e-6) with std_pop = (1 - exp(-4.67)) / 2
    low = math.exp(-(23 / 3 - 3))
    adv = (1.0 - low) / 2 / ((1.0 - low) / 2 + 1e-6)
    view = TreeView.load(trees / "env_step-000000.json")
    assert view.env_step == 0 and view.item_index == 0
    assert [n.completions for n in view.nodes] == [("Hi.", "Hello."), ("Hi.", DETAILED[1])]
    assert [n.reward for n in view.nodes] == [1.0, pytest.approx(low)]
    assert [n.advantages for n in view.nodes] == [
        (pytest.approx(adv), pytest.approx(adv)),
        (pytest.approx(-adv), pytest.approx(-adv)),
    ]
    assert TreeView.load(trees / "env_step-000006.json").item_index == 3


def test_a_resumed_run_draws_the_trees_of_the_same_rounds(tmp_path):
    import shutil

    trainer = scripted_trainer(tmp_path, items=4, tree_plot_interval=3, save_steps=2)
    trainer.train()
    trees = trainer.run_dir / "trees"
    shutil.rmtree(trees)
    again = scripted_trainer(tmp_path, items=4, tree_plot_interval=3, save_steps=2)
    again.train(resume_from_checkpoint=str(trainer.run_dir / "checkpoints" / "checkpoint-2"))
    # Rounds 3 and 4 of the run: round 4 (env_step 6) is every third's, round 3 is not.
    assert sorted(p.name for p in trees.iterdir()) == [
        f"env_step-000006.{ext}" for ext in ("html", "json", "png")
    ]
    assert again.rounds == 4


def test_the_logged_loss_is_the_one_worked_out_from_the_tree(tmp_path):
    trainer = scripted_trainer(tmp_path, items=1)
    low = math.exp(-(23 / 3 - 3))
    adv = (1.0 - low) / 2 / ((1.0 - low) / 2 + 1e-6)
    agent = trainer.agents[1]
    (row,) = agent.generate(["task 0"], 2)
    batch = build_batch(
        [c.prompt_ids for c in row], [c.completion_ids for c in row], agent.pad_token_id
    )
    with torch.no_grad():  # scored at the sampling temperature
        logprobs = sequence_logprobs(agent.model, batch, temperature=trainer.args.temperature)
    # sequence_sum: mean over the two completions of -A * (sum of its token log-probs)
    by_hand = -(adv * logprobs[0].sum() - adv * logprobs[1].sum()) / 2
    library = policy_gradient_loss(logprobs, batch.completion_mask, torch.tensor([adv, -adv]))
    assert float(library) == pytest.approx(float(by_hand), rel=1e-6)
    metrics = trainer.train()
    assert metrics["agent_1/loss"] == pytest.approx(float(by_hand), rel=1e-5)
    assert metrics["agent_0/loss"] == pytest.approx(0.0, abs=1e-6)  # equal texts: A cancels


def test_cmlrl_plot_draws_a_tree_json_and_a_run_folders_trees(tmp_path, capsys):
    view = rollout_tree_view(two_turn_tree())
    stem = tmp_path / "run" / "trees" / "env_step-000000"
    view.save(stem.with_suffix(".json"))
    assert main(["plot", str(stem.with_suffix(".json"))]) == 0
    assert capsys.readouterr().out.split() == [str(stem) + ".png", str(stem) + ".html"]
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    stem.with_suffix(".png").unlink()
    assert main(["plot", str(tmp_path / "run")]) == 0  # no metrics.jsonl: the trees only
    assert stem.with_suffix(".png").is_file()
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "run"), "--output", str(tmp_path / "x.png")]) == 2
    assert "names one file but" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text("{}")
    assert main(["plot", str(tmp_path / "broken.json")]) == 2
    assert "tree view: missing keys" in capsys.readouterr().err
