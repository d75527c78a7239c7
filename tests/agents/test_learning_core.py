"""The learning core's maths, each against a hand computation: the step engine, scoring at
the sampling temperature, the KL per token, the ratio on stale rows, truncated importance
weights, and early termination in the actor-critics' GAE."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from test_actor_critic import chain_tree
from test_magrpo_trainer import make_trainer, record_step_gradients
from torch import nn

from cmlrl_agents import MAGRPOConfig
from cmlrl_agents.foundation.distributed import DataParallel
from cmlrl_agents.functional.losses import (
    aggregate,
    policy_gradient_loss,
    policy_token_losses,
    ratio_stats,
    truncated_is_weights,
)
from cmlrl_agents.learning.batch import PolicyRow, TrainBatch
from cmlrl_agents.learning.credit import chain_credit, joint_returns
from cmlrl_agents.learning.engine import ChunkLoss, StepEngine, StepPlan
from cmlrl_agents.learning.policy_loss import OldScores, record_old_scores
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.sampling import candidates
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_agent

LN2 = math.log(2.0)
F64 = torch.float64
LOGP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 9.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
ADV = torch.tensor([2.0, -1.0], dtype=F64)


def two_rows() -> tuple[PolicyRow, PolicyRow]:
    """One agent's rows of two items, advantages +1 and -1."""
    return (
        PolicyRow(
            agent=0, item_slot=0, turn=1, prompt_ids=(1, 5), completion_ids=(10, 11), advantage=1.0
        ),
        PolicyRow(
            agent=0, item_slot=1, turn=1, prompt_ids=(2, 3), completion_ids=(12, 13), advantage=-1.0
        ),
    )


# -- the engine ---------------------------------------------------------------------------------
def _linear_plan(model: nn.Linear, optimizer: torch.optim.Optimizer, chunks, xs, ys) -> StepPlan:
    def loss(chunk, totals):
        err = ((model(xs[chunk]).squeeze(-1) - ys[chunk]) ** 2).sum() / totals["samples"]
        return ChunkLoss(err, {"loss": err.detach()}, {"err_max": err.detach()})

    return StepPlan(
        optimizers={"m": optimizer},
        chunks=chunks,
        count=lambda chunk: {"samples": float(len(chunk))},
        loss=loss,
        count_keys=["samples"],
        sum_keys=["loss"],
        max_keys=["err_max"],
    )


def test_the_engine_normalises_by_the_steps_totals_so_chunks_change_nothing() -> None:
    xs, ys = torch.arange(10.0).reshape(5, 2), torch.tensor([1.0, -1.0, 0.5, 2.0, 0.0])
    results = []
    for chunks in ([[0, 1, 2, 3, 4]], [[0, 1], [2, 3], [4]], [[0], [1], [2], [3], [4]]):
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        full = ((model(xs).squeeze(-1) - ys) ** 2).mean().item()
        result = StepEngine(DataParallel()).step(
            _linear_plan(model, optimizer, chunks, xs, ys), max_grad_norm=None
        )
        assert result.totals == {"samples": 5.0}
        assert result.stats["loss"] == pytest.approx(full)  # the mean over the step's samples
        results.append((result.stats["m/grad_norm"], model.weight.detach().clone()))
    for norm, weight in results[1:]:
        assert norm == pytest.approx(results[0][0])
        torch.testing.assert_close(weight, results[0][1])


def test_the_engine_clips_to_max_grad_norm_and_reports_the_norm_before_clipping() -> None:
    xs, ys = torch.ones(2, 2) * 10, torch.zeros(2)
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    result = StepEngine(DataParallel()).step(
        _linear_plan(model, optimizer, [[0, 1]], xs, ys), max_grad_norm=1.0
    )
    # d/dw mean((w.x)^2) = 2 * 20 * 10 per weight, d/db = 2 * 20: norm sqrt(2 * 400^2 + 40^2)
    expected = math.sqrt(2 * 400.0**2 + 40.0**2)
    assert result.stats["m/grad_norm"] == pytest.approx(expected)
    moved = torch.cat([model.weight.detach().reshape(-1) - 1.0, model.bias.detach()])
    assert moved.norm().item() == pytest.approx(1.0, rel=1e-5)  # the clipped step, lr 1


def test_the_engine_refuses_a_non_finite_step_before_any_weight_moves() -> None:
    model = nn.Linear(2, 1)
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    xs, ys = torch.tensor([[1.0, float("nan")]]), torch.zeros(1)
    with pytest.raises(FloatingPointError, match="m's gradient norm is nan"):
        StepEngine(DataParallel()).step(
            _linear_plan(model, optimizer, [[0]], xs, ys), max_grad_norm=1.0
        )
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_the_engine_refuses_statistics_the_plan_did_not_declare() -> None:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    plan = _linear_plan(model, optimizer, [[0]], torch.ones(1, 2), torch.zeros(1))
    undeclared = StepPlan(**{**plan.__dict__, "sum_keys": []})
    with pytest.raises(KeyError, match="'loss' is not in the plan's sum_keys"):
        StepEngine(DataParallel()).step(undeclared, max_grad_norm=None)


# -- the policy objective -----------------------------------------------------------------------
def test_kl_is_added_per_token_under_token_mean() -> None:
    # one token (row 0, position 1) has d = ref - logp = ln 2: k3 = 2 - ln 2 - 1 = 1 - ln 2
    logp = torch.tensor(LOGP, dtype=F64)
    ref = logp.clone()
    ref[0, 1] += LN2
    loss = policy_gradient_loss(logp, MASK, ADV, "token_mean", ref_logprobs=ref, kl_coef=0.5)
    # policy terms 2, 4, 6 and -0.5, -1.5 sum to 10; the KL adds 0.5 (1 - ln 2); 5 tokens
    assert loss.item() == pytest.approx((10 + 0.5 * (1 - LN2)) / 5)
    seq = policy_gradient_loss(logp, MASK, ADV, "sequence_sum", ref_logprobs=ref, kl_coef=0.5)
    assert seq.item() == pytest.approx((10 + 0.5 * (1 - LN2)) / 2)


def test_truncated_importance_weights_multiply_the_policy_term() -> None:
    logp = torch.tensor(LOGP, dtype=F64)
    sampler = logp.clone()
    sampler[0, 0] -= LN2  # the sampler found token (0, 0) half as likely: weight 2, capped 1.5
    sampler[1, 1] += LN2  # twice as likely: weight 0.5
    w = truncated_is_weights(logp, sampler, MASK, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 1.0], [1.0, 0.5, 1.0]], dtype=F64))
    per_token = policy_token_losses(logp, MASK, ADV, is_weights=w)
    torch.testing.assert_close(
        per_token, torch.tensor([[3.0, 4.0, 6.0], [-0.5, -0.75, 0.0]], dtype=F64)
    )
    assert aggregate(per_token, MASK, "sequence_sum").item() == pytest.approx((13 - 1.25) / 2)


def test_ratio_stats_hand() -> None:
    logp = torch.tensor([[0.0, LN2, -LN2]], dtype=F64)  # ratios 1, 2, 0.5 against old 0
    stats = ratio_stats(logp, torch.zeros_like(logp), torch.ones(1, 3).bool(), clip_range=0.2)
    assert stats["ratio_sum"].item() == pytest.approx(3.5)
    assert stats["ratio_max"].item() == pytest.approx(2.0)
    assert stats["clipped"].item() == 2
    # (r - 1) - log r: 0, 1 - ln 2, -0.5 + ln 2
    assert stats["approx_kl_sum"].item() == pytest.approx(0.5)


def test_log_probs_are_scored_at_the_temperature_one_or_per_row() -> None:
    agent = tiny_agent(seed=1)
    batch = build_batch([[1, 5, 9], [2, 3]], [[10, 11], [12, 13, 14]], 0)
    logits = agent.model(input_ids=batch.input_ids).logits
    for temps in (0.5, torch.tensor([0.5, 2.0])):
        got = sequence_logprobs(agent.model, batch, temperature=temps)
        t = temps if isinstance(temps, float) else temps.view(-1, 1, 1)
        manual = (logits[:, :-1] / t).log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])
        expected = torch.cat([torch.zeros(2, 1), manual[..., 0]], dim=1)
        expected = torch.where(batch.completion_mask.bool(), expected, 0.0)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_step_adds_the_kl_per_token_of_the_agent_at_its_temperature(tmp_path) -> None:
    trainer = make_trainer(
        tmp_path,
        num_agents=1,
        reference_kl_enabled=True,
        reference_kl_coef=0.5,
        loss_aggregation="token_mean",
        temperature=0.8,
    )
    model = trainer.agents[0].model
    reference = copy.deepcopy(model)
    with torch.no_grad():
        next(model.parameters()).add_(0.05)
    rows = [
        PolicyRow(
            agent=0,
            item_slot=0,
            turn=1,
            prompt_ids=(1, 5, 9),
            completion_ids=(10, 11, 12),
            advantage=0.0,
        ),
        PolicyRow(
            agent=0, item_slot=1, turn=1, prompt_ids=(2, 3), completion_ids=(13,), advantage=0.0
        ),
    ]
    batch = build_batch([r.prompt_ids for r in rows], [r.completion_ids for r in rows], 0)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch, temperature=0.8)
        ref = sequence_logprobs(reference, batch, temperature=0.8)
    d = torch.where(batch.completion_mask.bool(), ref - lp, 0.0)
    k3 = torch.exp(d) - d - 1
    metrics = trainer.learner.update(TrainBatch(tuple(rows), trainer.learner.windows(2)))
    # advantage 0: the loss is the KL term alone, a mean over the step's 4 completion tokens
    assert metrics["agent_0/loss"] == pytest.approx(0.5 * k3.sum().item() / 4, rel=1e-5)
    assert metrics["turn_1/reference_kl_mean"] == pytest.approx(k3.sum().item() / 2, rel=1e-5)


def test_a_batch_refuses_windows_that_are_not_its_items_once_each() -> None:
    rows = two_rows()  # item slots 0 and 1
    assert TrainBatch(rows, ((0,), (1,))).num_items == 2
    assert TrainBatch(rows, ((0, 1), ())).num_items == 2  # a rank without items in a step
    with pytest.raises(ValueError, match=r"windows=\(\(0, 1\), \(1,\)\) must hold each"):
        TrainBatch(rows, ((0, 1), (1,)))
    with pytest.raises(ValueError, match=r"rows of item slots \[1\] are in no window"):
        TrainBatch(rows, ((0,),))


def test_the_update_steps_on_the_batchs_windows_not_a_recut_of_the_config(tmp_path) -> None:
    trainer = make_trainer(tmp_path, num_agents=1, rollout_buffer_size=2, train_batch_size=2)
    assert trainer.learner.windows(2) == ((0, 1),)  # the config's cut: one step
    n = len(list(trainer.agents[0].model.parameters()))
    grads = record_step_gradients(trainer.learner.optimizers[0])
    trainer.learner.update(TrainBatch(two_rows(), ((0,), (1,))))
    assert len(grads) == 2 * n  # the batch's two windows: two optimizer steps


def test_later_steps_of_a_round_use_the_clipped_ratio_to_the_rows_before_the_round(tmp_path):
    trainer = make_trainer(
        tmp_path,
        num_agents=1,
        rollout_buffer_size=2,
        train_batch_size=1,
        agent_learning_rate=0.05,
        max_grad_norm=None,
        ppo_clip_range=0.1,
        reference_kl_enabled=False,  # the loss by hand below has no KL term
    )
    model = trainer.agents[0].model
    before = copy.deepcopy(model)
    rows = two_rows()
    grads = record_step_gradients(trainer.learner.optimizers[0])
    metrics = trainer.learner.update(TrainBatch(rows, trainer.learner.windows(2)))
    n = len(list(model.parameters()))
    second = grads[n:]  # the second step's gradients (item 1), taken after the first step
    # The second step's loss by hand: PPO's clipped surrogate against item 1's log-probs
    # under the weights before the round, at the sampling temperature 0.6.
    after_first = copy.deepcopy(before)
    opt = torch.optim.AdamW(after_first.parameters(), lr=0.05, weight_decay=0.0)
    for p, g in zip(after_first.parameters(), grads[:n], strict=True):
        p.grad = g.clone()
    opt.step()
    batch = build_batch([rows[1].prompt_ids], [rows[1].completion_ids], 0)
    with torch.no_grad():
        old = sequence_logprobs(before, batch, temperature=0.6)
    lp = sequence_logprobs(after_first, batch, temperature=0.6)
    ratio = torch.exp(lp - old)[batch.completion_mask.bool()]
    loss = -torch.minimum(ratio * -1.0, ratio.clamp(0.9, 1.1) * -1.0).sum()
    after_first.zero_grad()
    loss.backward()
    for got, p in zip(second, after_first.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, atol=1e-6, rtol=1e-4)
    assert metrics["agent_0/ratio_mean"] != 1.0 and "agent_0/clipfrac" in metrics


def test_ppo_epochs_steps_the_round_again_against_the_log_probs_its_first_step_scored(
    tmp_path, monkeypatch
):
    trainer = make_trainer(
        tmp_path,
        num_agents=1,
        rollout_buffer_size=2,
        ppo_epochs=2,
        agent_learning_rate=0.05,
        max_grad_norm=None,
        ppo_clip_range=0.1,
        forward_batch_size=None,
        reference_kl_enabled=False,
    )
    model = trainer.agents[0].model
    before = copy.deepcopy(model)
    rows = two_rows()
    import cmlrl_agents.learning.policy_step as policy_step

    passes = []
    scoring = policy_step.joint_pass
    monkeypatch.setattr(
        policy_step, "joint_pass", lambda *a, **k: passes.append(1) or scoring(*a, **k)
    )
    grads = record_step_gradients(trainer.learner.optimizers[0])
    metrics = trainer.learner.update(TrainBatch(rows, trainer.learner.windows(2)))
    # One pass per step: the first step's pass gives the rows' old log-probs, no pass of its own.
    assert len(passes) == 2
    n = len(list(model.parameters()))
    assert len(grads) == 2 * n and trainer.learner.steps_per_round(2) == 2
    batch = build_batch([r.prompt_ids for r in rows], [r.completion_ids for r in rows], 0)
    adv = torch.tensor([[1.0], [-1.0]])
    mask = batch.completion_mask.bool()
    # The first step: the plain policy gradient (ratio 1), a mean over the 2 completions.
    first = copy.deepcopy(before)
    lp = sequence_logprobs(first, batch, temperature=0.6)
    (-(adv * torch.where(mask, lp, 0.0)).sum() / 2).backward()
    for got, p in zip(grads[:n], first.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, atol=1e-6, rtol=1e-4)
    # The second: PPO's clipped surrogate against the log-probs before the round.
    opt = torch.optim.AdamW(first.parameters(), lr=0.05, weight_decay=0.0)
    opt.step()
    with torch.no_grad():
        old = sequence_logprobs(before, batch, temperature=0.6)
    lp = sequence_logprobs(first, batch, temperature=0.6)
    ratio = torch.where(mask, torch.exp(lp - old), 1.0)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(0.9, 1.1) * adv)
    first.zero_grad()
    (-torch.where(mask, surrogate, 0.0).sum() / 2).backward()
    for got, p in zip(grads[n:], first.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, atol=1e-6, rtol=1e-4)
    assert metrics["agent_0/ratio_max"] > 1.0 and "agent_0/clipfrac" in metrics


def test_ppo_epochs_above_one_need_the_clipped_ratio() -> None:
    with pytest.raises(ValueError, match=r"ppo_epochs=2 needs ppo_clip_range \(e.g. 0.2\)"):
        MAGRPOConfig(ppo_epochs=2, ppo_clip_range=None)
    with pytest.raises(ValueError, match="ppo_epochs must be"):
        MAGRPOConfig(ppo_epochs=0)
    assert MAGRPOConfig().ppo_epochs == 1


def test_old_log_probs_are_recorded_once_per_round() -> None:
    scored = torch.tensor([[-1.0, -2.0]])
    ctx = SimpleNamespace(
        indices=[3], logprobs=scored, mask=torch.tensor([[True, False]]), truncated_logprobs=None
    )
    old: dict[int, OldScores] = {}
    record_old_scores(old, ctx)  # type: ignore[arg-type]
    torch.testing.assert_close(old[3].logprobs, torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="row 3 already has old log-probs"):
        record_old_scores(old, ctx)  # type: ignore[arg-type]


def test_bf16_runs_the_losss_forwards_in_bfloat16_and_keeps_the_weights_float32(tmp_path):
    losses = {}
    for bf16 in (False, True):
        trainer = make_trainer(
            tmp_path / str(bf16), num_agents=1, bf16=bf16, reference_kl_enabled=True
        )
        model = trainer.agents[0].model
        before = [p.detach().clone() for p in model.parameters()]
        seen: set[torch.dtype] = set()
        linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
        hook = linear.register_forward_hook(lambda m, i, out, seen=seen: seen.add(out.dtype))
        metrics = trainer.learner.update(TrainBatch(two_rows(), trainer.learner.windows(2)))
        hook.remove()
        assert seen == ({torch.bfloat16} if bf16 else {torch.float32})
        assert all(p.dtype == torch.float32 for p in model.parameters())
        moved = [not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)]
        assert any(moved) and math.isfinite(metrics["loss"])
        losses[bf16] = metrics["agent_0/loss"]
        assert metrics["turn_1/reference_kl_mean"] == pytest.approx(0.0, abs=1e-6)
    # The same loss to bfloat16's rounding (8 bits of mantissa).
    assert losses[True] == pytest.approx(losses[False], rel=0.05)
    assert MAGRPOConfig().bf16 is False


def test_under_bf16_a_stale_steps_ratio_is_one_before_the_policy_moves(tmp_path) -> None:
    # The second window's old log-probs come from a pass before the round: under the loss's
    # autocast it is the loss's function, so at lr ~ 0 the ratio is 1 (in float32 passes it
    # would differ by bfloat16's rounding: 1.2e-4 on this tiny model).
    trainer = make_trainer(
        tmp_path,
        num_agents=1,
        bf16=True,
        rollout_buffer_size=2,
        train_batch_size=1,
        agent_learning_rate=1e-12,
        reference_kl_enabled=False,
    )
    metrics = trainer.learner.update(TrainBatch(two_rows(), trainer.learner.windows(2)))
    assert metrics["agent_0/ratio_max"] == pytest.approx(1.0, abs=1e-6)


def test_an_early_ended_chain_keeps_its_reward_for_its_unplayed_turns_in_gae() -> None:
    tree = chain_tree()  # item B ends at turn 1 of 2 with reward 0.95
    zero = [torch.zeros(len(level.states)) for level in tree.levels]
    _, ret = chain_credit(tree, zero, discount=0.9, lam=1.0)
    assert ret[0][1, 0].item() == pytest.approx(0.95 * (1 + 0.9))  # absorbing: 0.95 twice
    # the same value the MAGRPO family's tree return gives it
    assert joint_returns(tree, 0.9)[0][1, 0].item() == pytest.approx(0.95 * 1.9)


def tis_gradient(
    backend: str, sampler_logprobs, completion=(10, 11, 12), **sampling
) -> list[torch.Tensor]:
    """One step of a 1-agent learner on one row whose sampler reported ``sampler_logprobs``
    (a function of the trainer's model and the batch) for its tokens."""
    from cmlrl_agents import MAGRPOConfig
    from cmlrl_agents.algorithms.policy_gradient import PolicyGradientLearner

    agent = tiny_agent(seed=2)
    args = MAGRPOConfig(
        num_agents=1,
        generation_backend=backend,
        tis_cap=1.5,
        max_grad_norm=None,
        temperature=0.8,
        output_dir=None,
        **sampling,
    )
    learner = PolicyGradientLearner([agent], args, num_turns=1)
    batch = build_batch([(1, 5, 9)], [completion], 0)
    with torch.no_grad():
        reported = sampler_logprobs(agent.model, batch)
    row = PolicyRow(
        agent=0,
        item_slot=0,
        turn=1,
        prompt_ids=(1, 5, 9),
        completion_ids=completion,
        advantage=1.0,
        sampler_logprobs=tuple(reported.tolist()),
    )
    grads = record_step_gradients(learner.optimizers[0])
    learner.update(TrainBatch((row,), learner.windows(1)))
    return grads


def test_rows_from_a_separate_sampler_are_weighted_by_the_truncated_ratio() -> None:
    def halved(model, batch):  # the sampler found each token half as likely
        return sequence_logprobs(model, batch, temperature=0.8)[0, 3:] - LN2

    untruncated = {"top_k": None, "top_p": 1.0}
    plain = tis_gradient("hf", halved, **untruncated)  # the trainer's own model sampled
    weighted = tis_gradient("vllm", halved, **untruncated)  # ratio 2, truncated at 1.5
    for p, w in zip(plain, weighted, strict=True):
        torch.testing.assert_close(w, 1.5 * p, atol=1e-6, rtol=1e-4)


def test_the_weights_compare_the_samplers_truncated_distribution_with_the_trainers() -> None:
    # A fake vLLM that samples what the trainer samples: at temperature 0.8, top-k 5, top-p
    # 0.6. With logprobs_mode="processed_logprobs" it reports the log-probs of that truncated
    # distribution, and every weight is 1: the gradient is the trainer's own sampler's.
    prompt = torch.tensor([[1, 5, 9]])
    tokens = []
    model = tiny_agent(seed=2).model
    with torch.no_grad():  # the most likely tokens: inside any truncation
        for _ in range(3):
            ids = torch.cat([prompt, torch.tensor([tokens], dtype=torch.long)], 1)
            logits = model(input_ids=ids).logits
            tokens.append(int(logits[0, -1].argmax()))
    truncation = {"top_k": 5, "top_p": 0.6}

    def processed(model, batch):
        logits = model(input_ids=batch.input_ids).logits[0, 2:-1]
        probs, ids = candidates(logits, 0.8, 5, 0.6)
        at = [int((row == t).nonzero()[0, 0]) for row, t in zip(ids, tokens, strict=True)]
        kept = probs / probs.sum(-1, keepdim=True)
        return torch.log(kept[torch.arange(3), at])

    def raw(model, batch):  # vLLM's default, raw_logprobs: temperature 1, untruncated
        return sequence_logprobs(model, batch)[0, 3:]

    plain = tis_gradient("hf", raw, tuple(tokens), **truncation)
    exact = tis_gradient("vllm", processed, tuple(tokens), **truncation)
    for p, w in zip(plain, exact, strict=True):
        torch.testing.assert_close(w, p, atol=1e-6, rtol=1e-4)
    biased = tis_gradient("vllm", raw, tuple(tokens), **truncation)
    assert any(not torch.allclose(b, p, rtol=1e-3) for b, p in zip(biased, plain, strict=True))


def test_the_vllm_engine_reports_the_log_probs_of_the_distribution_it_draws_from(
    monkeypatch,
) -> None:
    import sys
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # a fake: no engine
    from cmlrl_agents.policies.vllm_backend import VLLMGenerate

    assert VLLMGenerate()._llm_kwargs["logprobs_mode"] == "processed_logprobs"
    assert VLLMGenerate(logprobs_mode="raw_logprobs")._llm_kwargs["logprobs_mode"] == (
        "raw_logprobs"
    )
