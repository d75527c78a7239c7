"""Mixed-adapter passes with each adapter's rows as a slice: the runs of names, the same
numbers as peft's gathered rows (bit for bit), peft's own path and errors for everything else,
and every layer as it was afterwards."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies.adapter_spans import adapter_span_forwards, adapter_spans
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.testing import tiny_agent

peft = pytest.importorskip("peft")
from peft.tuners.lora import layer as lora_layer  # noqa: E402


@pytest.mark.parametrize(
    ("names", "spans"),
    [
        ([], []),
        (["a"], [("a", 0, 1)]),
        (["a", "a", "b", "b", "b"], [("a", 0, 2), ("b", 2, 5)]),
        (["a", "b", "a", "__base__"], [("a", 0, 1), ("b", 1, 2), ("a", 2, 3), ("__base__", 3, 4)]),
    ],
)
def test_spans_are_the_runs_of_equal_names_in_order(names, spans) -> None:
    assert adapter_spans(names) == spans


def _two_adapters() -> LLMAgent:
    agent = tiny_agent(seed=0)
    config = dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    torch.manual_seed(7)  # lora_B drawn, not zero: each adapter changes the output
    model = peft.get_peft_model(agent.model, peft.LoraConfig(**config), "agent_0")
    model.add_adapter("agent_1", peft.LoraConfig(**config))
    return LLMAgent(model.eval(), agent.tokenizer, adapter="agent_0")


NAMES = ["agent_0"] * 3 + ["agent_1"] * 2 + ["__base__"] + ["agent_0"] * 2


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, **kwargs).logits


def test_a_mixed_pass_gives_peft_s_numbers_without_gathering_rows(monkeypatch) -> None:
    model = _two_adapters().model
    ids = torch.randint(3, 40, (len(NAMES), 6), generator=torch.Generator().manual_seed(0))
    ids[3] = ids[5] = ids[0]  # one input under agent_0, agent_1 and the base alone
    expected = _logits(model, ids, adapter_names=NAMES)
    assert not torch.equal(expected[0], expected[3])
    assert not torch.equal(expected[0], expected[5])
    assert not torch.equal(expected[3], expected[5])

    def gathered(*args: object, **kwargs: object) -> None:
        raise AssertionError("peft's gathered mixed batch ran inside the block")

    with adapter_span_forwards(model, NAMES):
        monkeypatch.setattr(lora_layer.Linear, "_mixed_batch_forward", gathered)
        got = _logits(model, ids, adapter_names=NAMES)
        monkeypatch.undo()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_layers_are_restored_on_leaving_and_untouched_without_a_mixed_batch() -> None:
    model = _two_adapters().model
    layers = [m for m in model.modules() if type(m) is lora_layer.Linear]
    assert len(layers) == 6  # 2 blocks x (q, v, o)
    with adapter_span_forwards(model, NAMES):
        assert all("forward" in vars(m) for m in layers)
    assert not any("forward" in vars(m) for m in layers)
    with pytest.raises(RuntimeError, match="inside"), adapter_span_forwards(model, NAMES):
        raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in layers)
    with adapter_span_forwards(model, None):  # no mixed batch: peft's forward, unwrapped
        assert not any("forward" in vars(m) for m in layers)


def test_anything_but_a_plain_mixed_batch_takes_peft_s_own_path_and_errors() -> None:
    model = _two_adapters().model
    ids = torch.randint(3, 40, (len(NAMES), 5), generator=torch.Generator().manual_seed(1))
    single = _logits(model, ids)  # the active adapter for every row, no adapter_names
    with model.disable_adapter():
        base = _logits(model, ids, adapter_names=NAMES)
    with adapter_span_forwards(model, NAMES):
        torch.testing.assert_close(_logits(model, ids), single, rtol=0, atol=0)
        with model.disable_adapter():
            torch.testing.assert_close(
                _logits(model, ids, adapter_names=NAMES), base, rtol=0, atol=0
            )
        with pytest.raises(ValueError, match="Length of `adapter_names`"):
            _logits(model, ids, adapter_names=NAMES[:-1])
        dora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
        model.add_adapter("dora", peft.LoraConfig(**dora))
        with pytest.raises(ValueError, match="DoRA"):
            _logits(model, ids, adapter_names=["dora"] + NAMES[1:])
        model.delete_adapter("dora")
        model.merge_adapter(["agent_1"])
        with pytest.raises(ValueError, match="merged adapters"):
            _logits(model, ids, adapter_names=NAMES)
        model.unmerge_adapter()


def test_agent_generation_samples_the_same_tokens_as_with_peft_s_own_path(monkeypatch) -> None:
    agent = _two_adapters()
    rows = [[5, 6, 7, 8]] * 3 + [[5, 6, 7, 8]] * 2 + [[11, 12, 13]] * 3
    names = ["agent_0"] * 3 + ["agent_1"] * 2 + ["agent_0"] * 3
    sampling = SamplingConfig(max_new_tokens=8, min_new_tokens=8, temperature=1.0, top_p=1.0)
    keys = [row_key(0, 0, 1, s) for s in range(len(rows))]

    def tokens() -> list[tuple[int, ...]]:
        done = agent.generate_rows(rows, sampling, adapter_names=names, keys=keys)
        return [c.completion_ids for c in done]

    spans = tokens()
    monkeypatch.setattr(agent_module, "adapter_span_forwards", lambda model, names: nullcontext())
    assert tokens() == spans
    assert spans[0] != spans[3]  # the same prompt answered under the two adapters
