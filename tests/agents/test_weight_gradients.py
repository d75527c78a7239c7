"""A weight used several times in one graph gathers its gradient in one buffer: autograd's
gradient (hand-worked, and against autograd's own on an agent's scoring), the buffer taken
without a copy, and every module left as it was, or alone where the path does not apply."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

from cmlrl_agents.learning.optim import make_adamw
from cmlrl_agents.policies import weight_gradients
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.policies.weight_gradients import gathered_weight_gradients
from cmlrl_agents.testing import tiny_agent


class _TiedTwice(nn.Module):
    """A lookup tied to a linear output layer, each used twice: two "passes" in one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(3, 2, padding_idx=0)
        self.head = nn.Linear(2, 3, bias=False)
        self.head.weight = self.embed.weight
        with torch.no_grad():
            self.embed.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]]))

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(first)).sum() + 2 * self.head(self.embed(second)).sum()


def test_a_weight_used_four_times_gets_the_hand_worked_gradient() -> None:
    # loss = sum_u c_u * sum_v W[v] . e_u over the looked-up rows e_u = W[id_u]: ids 1 and 2 in
    # the first pass (c = 1), 1 in the second (c = 2). The head's part, for every row v of W:
    # sum_u c_u e_u = (1, 2) + (3, -1) + 2 (1, 2) = (6, 5). The lookups' part: row id_u gets
    # c_u sum_v W[v] = c_u (4, 1), so row 1 gets 3 (4, 1) = (12, 3) and row 2 gets (4, 1).
    model = _TiedTwice()
    first, second = torch.tensor([1, 2]), torch.tensor([1])
    with gathered_weight_gradients(model):
        loss = model(first, second)
    loss.backward()
    expected = torch.tensor([[6.0, 5.0], [18.0, 8.0], [10.0, 6.0]])
    assert torch.equal(model.embed.weight.grad, expected)
    assert "forward" not in vars(model.embed) and "forward" not in vars(model.head)
    assert not model.embed.weight._backward_hooks


def test_the_padding_row_gets_no_lookup_gradient_as_in_nn_embedding() -> None:
    model, plain = _TiedTwice(), _TiedTwice()
    ids = torch.tensor([0, 2, 0])
    with gathered_weight_gradients(model):
        loss = model(ids, ids)
    loss.backward()
    plain(ids, ids).backward()
    assert torch.equal(model.embed.weight.grad, plain.embed.weight.grad)


def _tied_agent() -> LLMAgent:
    agent = tiny_agent(seed=1)
    model = agent.model
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return agent


def _gradients(agent: LLMAgent, prefix_sharing: bool, block: Any) -> dict[str, torch.Tensor]:
    # Two prompts, two completions each: with prefix sharing, the prompt pass and the
    # completions' pass both use every weight (and the tied one at both ends).
    prompts = [[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]]
    completions = [[11, 12, 13], [14, 12], [15, 16, 17, 18], [19]]
    batch = build_batch(prompts, completions, agent.pad_token_id)
    agent.model.zero_grad(set_to_none=True)
    with block(agent.model):
        scores = agent.score(batch, prefix_sharing=prefix_sharing, temperature=0.7)
    scores.sum().backward()
    return {n: p.grad for n, p in agent.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_an_agents_scoring_gets_autograds_gradients(
    monkeypatch: pytest.MonkeyPatch, prefix_sharing: bool, tied: bool
) -> None:
    agent = _tied_agent() if tied else tiny_agent(seed=1)
    gathered = _gradients(agent, prefix_sharing, lambda model: nullcontext())  # score_tokens'
    monkeypatch.setattr(
        "cmlrl_agents.policies.agent.gathered_weight_gradients", lambda model: nullcontext()
    )
    plain = _gradients(agent, prefix_sharing, lambda model: nullcontext())
    assert gathered.keys() == plain.keys() == {n for n, _ in agent.model.named_parameters()}
    for name in plain:
        torch.testing.assert_close(gathered[name], plain[name], rtol=1e-6, atol=1e-7, msg=name)


def test_autograd_takes_the_gathered_buffer_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: dict[int, int] = {}
    gather = weight_gradients._Gradient.gather

    def recording(self: Any, fresh: Any, add: Any) -> torch.Tensor | None:
        out = gather(self, fresh, add)
        if out is not None:
            handed[id(self.weight)] = out.data_ptr()
        return out

    monkeypatch.setattr(weight_gradients._Gradient, "gather", recording)
    agent = _tied_agent()
    _gradients(agent, True, gathered_weight_gradients)
    weights = [p for p in agent.model.parameters() if id(p) in handed]
    linear = {id(m.weight) for m in agent.model.modules() if type(m) is nn.Linear}
    assert {id(p) for p in weights} == linear  # every linear weight, the tied one among them
    assert all(handed[id(p)] == p.grad.data_ptr() for p in weights)
    assert not any(p._backward_hooks for p in agent.model.parameters())


def test_a_second_backward_and_an_accumulated_gradient_add_up() -> None:
    model = _TiedTwice()
    first, second = torch.tensor([1, 2]), torch.tensor([1])
    with gathered_weight_gradients(model):
        loss = model(first, second)
    loss.backward(retain_graph=True)
    once = model.embed.weight.grad.clone()
    loss.backward()  # the same graph again: its gradient adds to the one there
    assert torch.equal(model.embed.weight.grad, 2 * once)
    with gathered_weight_gradients(model):
        model(first, second).backward()  # a new graph, into the gradient already there
    assert torch.equal(model.embed.weight.grad, 3 * once)
    before = model.embed.weight.detach().clone()
    make_adamw(list(model.parameters()), 1e-2, "agent_0").step()
    assert not torch.equal(model.embed.weight, before)


def test_modules_are_restored_on_error_and_left_alone_where_the_path_does_not_apply() -> None:
    model = _TiedTwice()
    with pytest.raises(RuntimeError, match="inside"), gathered_weight_gradients(model):
        assert "forward" in vars(model.embed) and "forward" in vars(model.head)
        raise RuntimeError("inside")
    assert "forward" not in vars(model.embed) and "forward" not in vars(model.head)

    def patched(m: nn.Module) -> set[str]:
        with gathered_weight_gradients(m):
            return {name for name, module in m.named_modules() if "forward" in vars(module)}

    with torch.no_grad():
        assert patched(model) == set()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert patched(model) == set()
    frozen = _TiedTwice().requires_grad_(False)
    assert patched(frozen) == set()
    untied = _TiedTwice()
    untied.head.weight = nn.Parameter(untied.embed.weight.detach().clone())
    assert patched(untied) == {"head"}  # an untied lookup would gain nothing
    capped = _TiedTwice()
    capped.embed.max_norm = 1.0
    assert patched(capped) == set()  # the capped lookup, left to autograd, holds the weight too
    hooked = _TiedTwice()
    own = hooked.head.forward
    vars(hooked.head)["forward"] = own  # a forward of its own (as accelerate's hooks set)
    assert patched(hooked) == {"head"}  # its own, kept; so the lookup is not tied to a gatherer
    assert vars(hooked.head)["forward"] is own


def test_a_backward_that_does_not_reach_the_weight_leaves_the_next_one_its_gradient() -> None:
    # autograd.grad for the input alone runs every use's backward but never accumulates the
    # weight's gradient; the backward after it must still get the weight's whole gradient.
    def gradients(block: Any) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        layer, x = nn.Linear(3, 2, bias=False), torch.randn(4, 3, requires_grad=True)
        with block(layer):
            y = layer(x)
            loss = y.sum() + layer(y @ torch.ones(2, 3)).pow(2).sum()
        (input_gradient,) = torch.autograd.grad(loss, x, retain_graph=True)
        loss.backward()
        return input_gradient, layer.weight.grad

    gathered, plain = gradients(gathered_weight_gradients), gradients(lambda m: nullcontext())
    torch.testing.assert_close(gathered, plain, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_model_that_recomputes_its_layers_is_left_to_autograd(reentrant: bool) -> None:
    # Non-reentrant recomputation checks that the layers save what the first forward saved.
    agent = tiny_agent(seed=1)
    # transformers 5 renamed gradient checkpointing to activation checkpointing.
    enable = getattr(agent.model, "activation_checkpointing_enable", None)
    (enable or agent.model.gradient_checkpointing_enable)({"use_reentrant": reentrant})
    agent.model.train()
    with gathered_weight_gradients(agent.model):
        assert not any("forward" in vars(m) for m in agent.model.modules())
    batch = build_batch([[5, 6, 7], [5, 6, 7]], [[11, 12, 13], [14, 12]], agent.pad_token_id)
    agent.score(batch, prefix_sharing=False).sum().backward()
    assert agent.model.get_input_embeddings().weight.grad is not None


class _Scaled(nn.Embedding):
    """A lookup with a forward of its class's own (Gemma's scaled embedding): left to autograd."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * 3.0


def test_a_weight_that_a_module_left_to_autograd_holds_stays_on_autograds_path() -> None:
    # The head is used twice and the scaled lookup's part reaches the weight between them: had
    # the head gathered, autograd would have summed the lookup's part with the buffer out of
    # place and lost the head's later part (what Gemma's tied weight got with prefix sharing).
    def gradient(block: Any) -> torch.Tensor:
        model = _TiedTwice()
        scaled = _Scaled(3, 2, padding_idx=0)
        scaled.weight = model.embed.weight
        model.embed = scaled
        with block(model):
            assert not any("forward" in vars(m) for m in model.modules())
            loss = model(torch.tensor([1, 2]), torch.tensor([1]))
        loss.backward()
        return model.embed.weight.grad

    torch.testing.assert_close(
        gradient(gathered_weight_gradients), gradient(lambda m: nullcontext()), rtol=0, atol=0
    )


def test_a_tied_gemma_agent_gets_autograds_gradient_with_prefix_sharing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    from cmlrl_agents.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = GemmaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=2,
        eos_token_id=2, bos_token_id=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    agent = LLMAgent(GemmaForCausalLM(config), tokenizer, chat_template=False)
    assert type(agent.model.get_input_embeddings()) is not nn.Embedding
    gathered = _gradients(agent, True, lambda model: nullcontext())
    monkeypatch.setattr(
        "cmlrl_agents.policies.agent.gathered_weight_gradients", lambda model: nullcontext()
    )
    plain = _gradients(agent, True, lambda model: nullcontext())
    for name in plain:
        torch.testing.assert_close(gathered[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_two_scoring_calls_in_one_loss_get_autograds_gradients(
    monkeypatch: pytest.MonkeyPatch, prefix_sharing: bool, tied: bool
) -> None:
    # A DPO-style loss: two calls, two blocks, one backward; each weight gathers in one buffer.
    def gradients(agent: LLMAgent) -> dict[str, torch.Tensor]:
        prompts = [[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]]
        completions = [[11, 12, 13], [14, 12], [15, 16, 17, 18], [19]]
        chosen = build_batch(prompts, completions, agent.pad_token_id)
        rejected = build_batch(prompts[::-1], completions, agent.pad_token_id)
        agent.model.zero_grad(set_to_none=True)
        a = agent.score(chosen, prefix_sharing=prefix_sharing).sum(1)
        b = agent.score(rejected, prefix_sharing=prefix_sharing).sum(1)
        torch.nn.functional.logsigmoid(a - b).mean().neg().backward()
        return {n: p.grad for n, p in agent.model.named_parameters()}

    agent = _tied_agent() if tied else tiny_agent(seed=1)
    gathered = gradients(agent)
    monkeypatch.setattr(
        "cmlrl_agents.policies.agent.gathered_weight_gradients", lambda model: nullcontext()
    )
    plain = gradients(agent)
    for name in plain:
        torch.testing.assert_close(gathered[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_a_weight_frozen_after_the_forward_gets_no_gradient_as_with_autograd() -> None:
    model = _TiedTwice()
    with gathered_weight_gradients(model):
        loss = model(torch.tensor([1, 2]), torch.tensor([1]))
    model.embed.weight.requires_grad_(False)
    loss.backward()
    assert model.embed.weight.grad is None


def test_a_use_outside_the_scoring_call_in_the_same_backward_is_refused() -> None:
    agent = tiny_agent(seed=1)
    batch = build_batch([[5, 6, 7], [5, 6, 7]], [[11, 12, 13], [14, 12]], agent.pad_token_id)
    loss = agent.score(batch, prefix_sharing=True).sum()
    loss = loss + agent.model(input_ids=batch.input_ids).logits.sum()
    with pytest.raises(RuntimeError, match="from outside LLMAgent's scoring calls"):
        loss.backward()
    assert not any(p._backward_hooks for p in agent.model.parameters())
    agent.model.zero_grad(set_to_none=True)
    agent.score(batch, prefix_sharing=True).sum().backward()  # the next backward is unaffected
    assert all(p.grad is not None for p in agent.model.parameters())


def test_a_backward_stopped_by_an_error_leaves_the_next_one_the_whole_gradient() -> None:
    # The second pass's uses run first in the backward, then a hook on the first pass's output
    # raises: the weight's buffer and hook are left behind, and must not leak into the next
    # backward of the same graph.
    def gradient(block: Any, fail: bool) -> torch.Tensor:
        model = _TiedTwice()
        calls = {"n": 0}

        def stop(grad: torch.Tensor) -> torch.Tensor:
            calls["n"] += 1
            if fail and calls["n"] == 1:
                raise ValueError("stop")
            return grad

        with block(model):
            first = model.head(model.embed(torch.tensor([1, 2])))
            first.register_hook(stop)
            loss = first.sum() + 2 * model.head(model.embed(torch.tensor([1]))).sum()
        if fail:
            with pytest.raises(ValueError, match="stop"):
                loss.backward(retain_graph=True)
        loss.backward()
        return model.embed.weight.grad

    torch.testing.assert_close(
        gradient(gathered_weight_gradients, True), gradient(lambda m: nullcontext(), False)
    )
