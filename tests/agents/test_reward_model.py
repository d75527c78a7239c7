"""The reward model learned from preferences: Bradley-Terry, held-out accuracy, reward_func use."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer, PreferencePair, PreferenceRewardModel
from cmlrl_agents.algorithms.reward_learner import RewardFit, RewardFitArgs, RewardModelLearner
from cmlrl_agents.algorithms.reward_model import joint_text, split_pairs
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_reward_model, tiny_tokenizer
from cmlrl_env import tasks


def reward_model(seed: int = 0) -> PreferenceRewardModel:
    tokenizer = tiny_tokenizer()
    return PreferenceRewardModel(tiny_reward_model(len(tokenizer), seed), tokenizer, device="cpu")


def synthetic_pairs(n: int, seed: int) -> list[PreferencePair]:
    """The first agent's response ends in " good" when chosen and " bad" when rejected, after
    random filler; the second agent's responses are noise."""
    rng = random.Random(seed)

    def filler() -> str:
        return "".join(rng.choice("xyzuvw ") for _ in range(rng.randint(3, 8)))

    return [
        PreferencePair(
            ("p", "p"),
            (filler() + " good", filler()),
            (filler() + " bad", filler()),
            item={"prompt": f"task {i}"},
        )
        for i in range(n)
    ]


def test_joint_text_by_hand():
    text = joint_text(["hi", "yo"], {"prompt": "Say"})
    assert text == "Task: Say\n\nAgent 1 response:\nhi\n\nAgent 2 response:\nyo"
    assert joint_text(["a"], None) == "Agent 1 response:\na"


def test_split_is_seeded_and_disjoint():
    pairs = synthetic_pairs(10, 0)
    train, held = split_pairs(pairs, 0.2, seed=3)
    assert (len(train), len(held)) == (8, 2)
    assert split_pairs(pairs, 0.2, seed=3) == (train, held)
    assert not {id(p) for p in train} & {id(p) for p in held}


def test_held_out_accuracy_rises_well_above_chance():
    model = reward_model()
    train, held = synthetic_pairs(90, seed=1), synthetic_pairs(40, seed=2)
    metrics = model.fit(train, held, learning_rate=3e-3, epochs=3, batch_size=8, seed=0)
    assert metrics["reward_model/eval_accuracy"] >= 0.9
    assert (
        metrics["reward_model/eval_accuracy"] - metrics["reward_model/eval_accuracy_before"] >= 0.3
    )
    assert metrics["reward_model/eval_pairs"] == 40 and metrics["reward_model/train_pairs"] == 90


def test_as_a_reward_func_it_scores_joint_texts_without_gradients():
    model = reward_model()
    item = {"prompt": "task"}
    rewards = model(["a good", "b bad"], ["x", "y"], batch_items=[item])
    expected = model.score([joint_text(["a good", "x"], item), joint_text(["b bad", "y"], item)])
    assert rewards == pytest.approx(expected.tolist())
    assert all(isinstance(r, float) for r in rewards)


def test_a_trainer_uses_it_and_never_moves_or_updates_it(tmp_path):
    model = reward_model().freeze()
    before = copy.deepcopy(model.model.state_dict())
    train, _ = tasks.length_ratio_splits()
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=model,
        train_dataset=train,
        args=MAGRPOConfig(
            num_generations=2, max_new_tokens=4, eval_interval=0, output_dir=str(tmp_path)
        ),
    )
    trainer.train()
    assert model.device == torch.device("cpu")
    assert all(torch.equal(v, before[k]) for k, v in model.model.state_dict().items())
    assert all(not p.requires_grad for p in model.model.parameters())


def test_device_defaults_to_cuda_only_when_there_is_one():
    tokenizer = tiny_tokenizer()
    model = PreferenceRewardModel(tiny_reward_model(len(tokenizer)), tokenizer)
    assert model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_rows_are_padded_with_the_pad_id_the_model_pools_by():
    # Llama-2's config names pad 0 while its tokenizer has none (so EOS would pad): the model
    # scores each row at its last token that is not config.pad_token_id, so a shorter row of a
    # batch padded with another id was scored at its padding.
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = None
    model = tiny_reward_model(len(tokenizer))
    model.config.pad_token_id = 0
    rm = PreferenceRewardModel(model, tokenizer, device="cpu")
    assert rm.pad_token_id == model.config.pad_token_id == 0
    texts = ["so good", "a much longer response here", "z"]
    with torch.no_grad():
        batched = rm.score(texts)
        alone = torch.cat([rm.score([t]) for t in texts])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


def test_a_model_with_more_than_one_output_is_refused():
    tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match="num_labels=1"):
        PreferenceRewardModel(tiny_model(len(tokenizer)), tokenizer)


def weights(model: PreferenceRewardModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.model.named_parameters()}


def test_forward_batch_size_bounds_each_forward_and_changes_no_number():
    pairs = synthetic_pairs(6, seed=4)
    whole, chunked = reward_model(), reward_model()
    chunked.forward_batch_size = 2
    sizes: list[int] = []
    chunked.model.register_forward_pre_hook(
        lambda m, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    fits = [m.fit(pairs, learning_rate=1e-2, batch_size=6, seed=0) for m in (whole, chunked)]
    assert fits[0]["reward_model/loss"] == pytest.approx(fits[1]["reward_model/loss"], rel=1e-5)
    assert sizes and max(sizes) == 2  # every forward of the fit and the accuracies: 2 texts
    for name, value in weights(whole).items():  # Adam's first step divides by |g|: float noise
        torch.testing.assert_close(weights(chunked)[name], value, rtol=1e-4, atol=1e-4)
    texts = [joint_text(p.chosen, p.item) for p in pairs]
    # The same weights scored in chunks of 2 and in one forward; the two fits' weights differ by
    # Adam's float noise above, so comparing across models would measure that, not the chunking.
    in_chunks = chunked.score(texts)
    chunked.forward_batch_size = None
    torch.testing.assert_close(in_chunks, chunked.score(texts), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="forward_batch_size=0 must be a positive number"):
        PreferenceRewardModel(tiny_reward_model(99), tiny_tokenizer(), forward_batch_size=0)


def test_fit_applies_weight_decay_and_the_warmup_schedule():
    pairs = synthetic_pairs(4, seed=5)  # one step of 4 pairs
    start = reward_model()
    before = weights(start)
    warm = copy.deepcopy(start)
    warm.fit(pairs, learning_rate=1e-2, batch_size=4, warmup_steps=1, seed=0)
    for name, value in weights(warm).items():  # the first step of a warmup is at lr 0
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    plain, decayed = copy.deepcopy(start), copy.deepcopy(start)
    plain.fit(pairs, learning_rate=1e-2, batch_size=4, seed=0, max_grad_norm=None)
    decayed.fit(
        pairs, learning_rate=1e-2, batch_size=4, seed=0, max_grad_norm=None, weight_decay=0.5
    )
    # AdamW's decoupled decay: the same Adam step, plus -lr * wd * p of the weights before it.
    for name, value in weights(decayed).items():
        torch.testing.assert_close(
            value - weights(plain)[name], -1e-2 * 0.5 * before[name], rtol=1e-4, atol=1e-7
        )


def test_the_reward_learner_updates_on_a_fit_and_equals_fit():
    pairs = synthetic_pairs(6, seed=6)
    by_fit, by_learner = reward_model(), reward_model()
    before = weights(by_learner)
    expected = by_fit.fit(pairs[:4], pairs[4:], learning_rate=1e-2, batch_size=2, seed=3)
    learner = RewardModelLearner(by_learner, RewardFitArgs(learning_rate=1e-2, batch_size=2))
    assert learner.optimizers == [] and learner.reference_models is None
    got = learner.update(RewardFit(pairs[:4], pairs[4:], seed=3))
    assert got == expected  # the same fit, digit for digit
    assert got["reward_model/loss"] > 0 and got["reward_model/train_pairs"] == 4.0
    assert any(not torch.equal(v, before[n]) for n, v in weights(by_learner).items())
    assert len(learner.optimizers) == 1  # the fit's own AdamW: 2 steps of 2 pairs
    steps = {float(state["step"]) for state in learner.optimizers[0].state.values()}
    assert steps == {2.0}
    modules, optimizers = learner.checkpoint_parts()
    assert modules == {"reward_model": by_learner.model} and optimizers == {}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RewardFit(()), "a reward fit needs at least one training pair"),
        (lambda: RewardFitArgs(batch_size=0), "batch_size must be an int >= 1, got 0"),
        (lambda: RewardFitArgs(epochs=1.5), "epochs must be an int >= 1, got 1.5"),
        (lambda: RewardFitArgs(learning_rate=0.0), "learning_rate must be > 0, got 0.0"),
    ],
)
def test_bad_fits_are_refused_when_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()
