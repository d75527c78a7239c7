"""Decoding with prepared weights (``[in, out]`` copies, weights packed for oneDNN): the same
products for few rows, nn.Linear's own path for many, every layer as it was afterwards, and the
same sampled tokens."""

from __future__ import annotations

import io
from contextlib import nullcontext

import pytest
import torch
from torch import nn

from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies import decode_layout as layout
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.testing import tiny_agent

onednn = pytest.mark.skipif(not layout.onednn_linear(), reason="this torch has no oneDNN linear")


@pytest.fixture(autouse=True)
def _copies(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the copies do is tested on every CPU; which weights a CPU gets is the gate's test below.
    monkeypatch.setattr(layout, "decode_weights", lambda: "copies")


def _cpu(monkeypatch: pytest.MonkeyPatch, capability: str, vendor: str, onednn: bool) -> None:
    """The real gate, on a CPU described by torch's kernels, its vendor and oneDNN."""
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(layout, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: onednn)


def _layer(bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(12, 20, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_use_the_copy_taken_on_entry_and_many_rows_the_layer_itself(bias: bool) -> None:
    layer = _layer(bias)
    few = torch.randn(3, 1, 12)  # 3 decoding rows
    many = torch.randn(layout.DECODE_ROWS + 1, 12)
    before_few, before_many = layer(few), layer(many)
    with torch.no_grad(), layout.decode_layout(layer, 3):
        assert "forward" in vars(layer)
        torch.testing.assert_close(layer(few), before_few)
        torch.testing.assert_close(layer(many), before_many, rtol=0, atol=0)
        # The copy was taken on entry: a change of the weight inside reaches only the
        # many-row path (nn.Linear's), which is why the block is for inference only.
        layer.weight.add_(1.0)
        torch.testing.assert_close(layer(few), before_few)
        assert not torch.allclose(layer(many), before_many)
    assert "forward" not in vars(layer)
    torch.testing.assert_close(layer(few), nn.functional.linear(few, layer.weight, layer.bias))


def test_every_layer_is_restored_when_the_block_raises() -> None:
    model = nn.Sequential(_layer(), nn.ReLU(), nn.Linear(20, 4))
    with pytest.raises(RuntimeError, match="inside"), layout.decode_layout(model, 1):
        assert all("forward" in vars(m) for m in model if isinstance(m, nn.Linear))
        raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in model)


def test_layers_it_was_not_measured_on_or_must_not_wrap_are_left_alone() -> None:
    class Special(nn.Linear):
        """A subclass (a quantised layer, say) computes something else."""

    hooked = _layer()
    hook = hooked.forward  # an instance forward, as accelerate's hooks set one
    hooked.forward = hook  # type: ignore[method-assign]
    half = _layer().to(torch.bfloat16)
    special = Special(12, 20)
    plain = _layer()
    model = nn.ModuleList([hooked, half, special, plain])
    with layout.decode_layout(model, 1):
        assert vars(hooked)["forward"] is hook
        assert "forward" not in vars(half) and "forward" not in vars(special)
        assert "forward" in vars(plain)
    assert vars(hooked)["forward"] is hook  # not removed either
    assert "forward" not in vars(plain)


def test_no_copies_for_a_batch_whose_decoding_steps_would_not_use_them() -> None:
    layer = _layer()
    with layout.decode_layout(layer, layout.DECODE_ROWS + 1):
        assert "forward" not in vars(layer)


@pytest.mark.parametrize(
    ("capability", "vendor", "onednn", "weights"),
    [
        ("AVX512", "GenuineIntel", True, "copies"),
        ("AVX512", "", True, "copies"),  # the vendor unknown: the measured AVX-512 path
        ("AVX512", "AuthenticAMD", True, "packed"),
        ("AVX512", "AuthenticAMD", False, "copies"),  # nothing to pack with
        ("AVX2", "AuthenticAMD", True, "packed_output"),
        ("AVX2", "GenuineIntel", True, "packed_output"),
        ("AVX2", "AuthenticAMD", False, "as_is"),
        ("DEFAULT", "AuthenticAMD", True, "as_is"),
        ("SVE256", "", True, "as_is"),
    ],
)
def test_each_cpu_gets_the_weights_it_was_measured_to_decode_fastest_with(
    monkeypatch: pytest.MonkeyPatch, capability: str, vendor: str, onednn: bool, weights: str
) -> None:
    _cpu(monkeypatch, capability, vendor, onednn)
    assert layout.decode_weights() == weights


@pytest.mark.parametrize(
    ("cpuinfo", "vendor"),
    [
        ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n", "AuthenticAMD"),
        (
            "processor\t: 0\nvendor_id\t: GenuineIntel\n\nprocessor\t: 1\nvendor_id\t: x\n",
            "GenuineIntel",
        ),
        ("processor\t: 0\nCPU implementer\t: 0x41\n", ""),  # ARM's /proc/cpuinfo names none
        (None, ""),  # no /proc/cpuinfo (macOS, Windows)
    ],
)
def test_the_vendor_is_the_first_one_linux_reports(
    monkeypatch: pytest.MonkeyPatch, cpuinfo: str | None, vendor: str
) -> None:
    def fake_open(path: str, encoding: str) -> io.StringIO:
        assert path == "/proc/cpuinfo"
        if cpuinfo is None:
            raise FileNotFoundError(path)
        return io.StringIO(cpuinfo)

    monkeypatch.setattr(layout, "open", fake_open, raising=False)
    layout.cpu_vendor.cache_clear()
    try:
        assert layout.cpu_vendor() == vendor
    finally:
        layout.cpu_vendor.cache_clear()  # the next caller reads the real file


class _WithOutput(nn.Module):
    """A model with an output layer it names, as a transformers causal LM does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _layer()
        self.head = nn.Linear(20, 30, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.head


@onednn
@pytest.mark.parametrize("bias", [True, False])
def test_packed_output_layer_gives_the_products_for_few_rows_and_its_own_path_for_many(
    monkeypatch: pytest.MonkeyPatch, bias: bool
) -> None:
    monkeypatch.setattr(layout, "decode_weights", lambda: "packed_output")
    model = _WithOutput()
    model.head = nn.Linear(20, 30, bias=bias)
    few = torch.randn(3, 1, 20)
    many = torch.randn(layout.DECODE_ROWS + 1, 20)
    before_few, before_many = model.head(few), model.head(many)
    with torch.no_grad(), layout.decode_layout(model, 3):
        assert "forward" in vars(model.head)
        assert "forward" not in vars(model.body)  # only the output layer is packed
        torch.testing.assert_close(model.head(few), before_few)
        torch.testing.assert_close(model.head(many), before_many, rtol=0, atol=0)
        model.head.weight.add_(1.0)  # packed on entry: the few-row path does not follow
        torch.testing.assert_close(model.head(few), before_few)
    assert not any("forward" in vars(m) for m in model.modules())


@onednn
def test_every_packed_layer_gives_the_products_for_few_rows_and_its_own_path_for_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(layout, "decode_weights", lambda: "packed")
    model = _WithOutput()
    few = torch.randn(3, 1, 12)
    many = torch.randn(layout.DECODE_ROWS + 1, 12)
    before_few, before_many = model.head(model.body(few)), model.head(model.body(many))
    with torch.no_grad(), layout.decode_layout(model, 3):
        assert "forward" in vars(model.body) and "forward" in vars(model.head)
        assert vars(model.body)["forward"].args[0] is layout._packed_product
        torch.testing.assert_close(model.head(model.body(few)), before_few)
        torch.testing.assert_close(model.head(model.body(many)), before_many, rtol=0, atol=0)
        model.body.weight.add_(1.0)  # packed on entry: the few-row path does not follow
        torch.testing.assert_close(model.head(model.body(few)), before_few)
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize(
    ("weights", "body", "head"),
    [
        ("copies", True, True),
        ("packed", True, True),
        ("packed_output", False, True),
        ("as_is", False, False),
    ],
)
def test_each_choice_of_weights_prepares_its_layers(
    monkeypatch: pytest.MonkeyPatch, weights: str, body: bool, head: bool
) -> None:
    if weights.startswith("packed") and not layout.onednn_linear():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(layout, "decode_weights", lambda: weights)
    model = _WithOutput()
    with layout.decode_layout(model, 1):
        assert ("forward" in vars(model.body)) is body
        assert ("forward" in vars(model.head)) is head
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize(
    ("path", "product_name"),
    [
        ("copies", "_copy_product"),
        pytest.param("packed", "_packed_product", marks=onednn),
        pytest.param("packed_output", "_packed_product", marks=onednn),
    ],
)
def test_generation_runs_its_decoding_steps_on_the_prepared_weights_and_samples_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch, path: str, product_name: str
) -> None:
    monkeypatch.setattr(layout, "decode_weights", lambda: path)
    agent = tiny_agent(seed=3, eos_bias=1.0)
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, top_k=20, top_p=0.9)
    prompts = ["Describe a city.", "Invent a holiday."]
    keys = [row_key(5, p, g) for p in range(2) for g in range(3)]
    calls = {"few": 0}
    product = getattr(layout, product_name)

    def counted(layer: nn.Linear, prepared: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        assert x.numel() // x.shape[-1] <= layout.DECODE_ROWS  # the prompt pass keeps its own
        calls["few"] += 1
        return product(layer, prepared, x)

    monkeypatch.setattr(layout, product_name, counted)
    prepared = agent.generate(prompts, 3, sampling, keys=keys)
    assert calls["few"] > 0
    assert not any("forward" in vars(m) for m in agent.model.modules())
    monkeypatch.setattr(agent_module, "decode_layout", lambda model, sequences: nullcontext())
    without = agent.generate(prompts, 3, sampling, keys=keys)
    assert [[c.completion_ids for c in row] for row in prepared] == [
        [c.completion_ids for c in row] for row in without
    ]
