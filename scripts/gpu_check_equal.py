"""The equalities of ``gpu_check.py``: mixed-adapter generation and prefix-shared scoring against
the plain path, the same ones the CPU tests assert (tests/agents/test_prefix_scoring.py,
test_adapter_agents.py, test_generation_batch.py), through the public agent API.

- Generation: one prompt under two adapters plus prompts of their own, greedy, in ONE
  mixed-adapter ``agent.generate_rows(rows, adapter_names=...)`` call; against transformers'
  ``generate`` over the same rows with no shared prompt pass, and against each adapter's agent
  generating its rows alone.
- Scoring: ``agent.score(batch, prefix_sharing=True)`` against ``prefix_sharing=False`` in
  log-probs and gradients, for a mixed-adapter batch (both adapters' gradients) and for a
  full model; and the mixed-adapter pass against each adapter's agent scoring its rows alone.

In float32 the tolerances are the CPU tests' (generation token for token). In bf16 two
computations of one thing round differently, so greedy decoding may part at a near-tie: a row
passes when it is equal, or when at the first token where it parts the two choices' log-probs
(under the plain path) differ by at most ``tie_gap``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from gpu_check_models import PROMPTS, Size, build_model, lora_config

from cmlrl_agents import LLMAgent, SamplingConfig
from cmlrl_agents.policies.tokens import build_batch

TOLERANCES = {
    "float32/cpu": {"logprob_atol": 1e-5, "grad_rel_l2": 1e-4, "tie_gap": 0.0},
    "float32/cuda": {"logprob_atol": 1e-4, "grad_rel_l2": 1e-4, "tie_gap": 0.0},
    "bfloat16/cuda": {"logprob_atol": 5e-2, "grad_rel_l2": 5e-2, "tie_gap": 5e-2},
}
"""float32 on the CPU: the CPU tests' log-prob ``atol`` and their gradient ``rtol``, here applied
to each gradient tensor's norm (relative L2 error): at 135M parameters an element-wise ``atol``
of 1e-5 fails on large gradient entries that agree to 4e-6 of the tensor's norm; the tests'
element-wise ``allclose(atol=1e-5, rtol=1e-4)`` is reported beside it. Tokens equal. float32 on
CUDA: log-probs within 1e-4 (about ten float32 steps at -11: cuBLAS picks its kernels by shape,
and the shared and plain passes differ in shape). bfloat16: log-probs within 0.05 nats (about
0.5 % of a random model's -10.8), each gradient tensor within 5 % of its norm, greedy paths
parting only where the two tokens' log-probs are within 0.05 nats."""


def tolerance(dtype: torch.dtype, device: str) -> dict[str, float]:
    key = f"{str(dtype).removeprefix('torch.')}/{torch.device(device).type}"
    if key not in TOLERANCES:
        raise ValueError(f"no tolerances for {key}; known: {sorted(TOLERANCES)}")
    return {"name": key, **TOLERANCES[key]}  # type: ignore[dict-item]


def adapter_team(size: Size, tokenizer: Any, device: str, dtype: torch.dtype) -> list[LLMAgent]:
    """Two agents with different random adapters (float32) on one base in ``dtype``."""
    from peft import get_peft_model

    base = build_model(size, len(tokenizer), dtype, device, seed=2)
    torch.manual_seed(7)
    model = get_peft_model(base, lora_config(random_init=True), adapter_name="agent_0")
    model.add_adapter("agent_1", lora_config(random_init=True))
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
    return [LLMAgent(model, tokenizer, adapter=f"agent_{i}") for i in range(2)]


def plain_generate(agent: LLMAgent, rows: Sequence[Sequence[int]], tokens: int, names: Any):
    """transformers' ``generate`` over left-padded rows, greedy, no shared prompt pass."""
    width = max(len(r) for r in rows)
    pad = agent.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=agent.device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=ids.device)
    extra = {} if names is None else {"adapter_names": list(names)}
    agent.activate()
    agent.model.eval()
    with torch.inference_mode():
        out = agent.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=pad,
            eos_token_id=sorted(agent.eos_token_ids),
            **extra,
        )
    return [tuple(row) for row in out[:, width:].tolist()]


def tie_gap(agent: LLMAgent, name: str, prompt: Sequence[int], a: tuple, b: tuple) -> float:
    """0 when ``a == b``; else the log-prob gap, under the plain path with adapter ``name``,
    between the two tokens chosen where the completions first part."""
    if a == b:
        return 0.0
    d = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    batch = build_batch([prompt, prompt], [a[: d + 1], b[: d + 1]], agent.pad_token_id)
    with torch.no_grad():
        lp = agent.score(batch.to(agent.device), adapter_names=[name, name])
    return float((lp[0, len(prompt) + d] - lp[1, len(prompt) + d]).abs())


def check_generation(agents: list[LLMAgent], tokens: int, tol: dict) -> dict[str, Any]:
    lead = agents[0]
    a, b, c = (lead.encode_prompts([p])[0] for p in PROMPTS[:3])
    rows = [a] * 3 + [a] * 3 + [b] * 2 + [c] * 2
    names = ["agent_0"] * 3 + ["agent_1"] * 3 + ["agent_0"] * 2 + ["agent_1"] * 2
    greedy = SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    mixed = [x.completion_ids for x in lead.generate_rows(rows, greedy, adapter_names=names)]
    plain = plain_generate(lead, rows, tokens, names)
    alone: list[tuple] = [()] * len(rows)
    for k, agent in enumerate(agents):
        mine = [i for i, n in enumerate(names) if n == f"agent_{k}"]
        for i, got in zip(mine, agent.generate_rows([rows[i] for i in mine], greedy), strict=True):
            alone[i] = got.completion_ids
    result: dict[str, Any] = {"rows": len(rows), "tokens": tokens}
    for label, other in (("vs_plain_generate", plain), ("vs_each_adapter_alone", alone)):
        rows_of = zip(names, rows, mixed, other, strict=True)
        gaps = [tie_gap(lead, name, row, x, y) for name, row, x, y in rows_of]
        result[label] = {
            "rows_equal": sum(x == y for x, y in zip(mixed, other, strict=True)),
            "max_tie_gap": max(gaps),
            "ok": max(gaps) <= tol["tie_gap"],
        }
    # One prompt under two adapters: equal answers would make the check vacuous.
    result["adapters_differ"] = mixed[0] != mixed[3]
    checks = ("vs_plain_generate", "vs_each_adapter_alone")
    result["ok"] = result["adapters_differ"] and all(result[k]["ok"] for k in checks)
    return result


def scoring_rows(agent: LLMAgent, vocab: int, seed: int = 3) -> tuple[list, list]:
    """Prompts repeated for their samples (G = 4, 4, 2), completions of 1..8 random tokens."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for p, g in zip(PROMPTS[3:6], (4, 4, 2), strict=True):
        ids = agent.encode_prompts([p])[0]
        for _ in range(g):
            prompts.append(ids)
            completions.append([rng.randrange(3, vocab) for _ in range(rng.randint(1, 8))])
    return prompts, completions


def scored(agents: list[LLMAgent], batch: Any, names: Any, shared: bool) -> tuple:
    """Log-probs of the rows and the gradients of a weighted sum of them: one pass (each row
    under its adapter when ``names`` are given), or with ``names == "alone"`` each adapter's
    rows in a pass of its own, the gradients summed."""
    params = [p for agent in agents for p in agent.trainable_parameters()]
    for p in params:
        p.grad = None
    weights = torch.linspace(-1.0, 2.0, batch.input_ids.shape[0], device=batch.input_ids.device)
    passes = [(agents[0], list(range(len(weights))), names)]
    if names == "alone":
        rows = {agent.adapter: [] for agent in agents}
        for i in range(len(weights)):
            rows[agents[i % len(agents)].adapter].append(i)
        passes = [(agent, rows[agent.adapter], None) for agent in agents]
    lp = torch.zeros(batch.input_ids.shape, device=weights.device)
    for agent, rows, adapter_names in passes:
        for p in params:
            p.requires_grad_(True)  # a mixed pass trains every adapter in it
        mine = agent.score(batch.select(rows), adapter_names=adapter_names, prefix_sharing=shared)
        (mine.sum(dim=1) * weights[rows]).sum().backward()
        lp[rows] = mine.detach().float()
    # An adapter no row used has no gradient: zeros, which the comparison then shows.
    return lp, [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def compare(a: tuple, b: tuple, tol: dict) -> dict[str, Any]:
    (a_lp, a_g), (b_lp, b_g) = a, b
    lp_diff = float((a_lp - b_lp).abs().max())
    pairs = list(zip(a_g, b_g, strict=True))
    rel = [float((x - y).norm() / y.norm().clamp_min(1e-30)) for x, y in pairs]
    result = {
        "max_logprob_diff": lp_diff,
        "max_grad_rel_l2": max(rel),
        "grads_elementwise_allclose_as_tests": all(
            bool(torch.allclose(x, y, atol=1e-5, rtol=1e-4)) for x, y in pairs
        ),
        "grads_nonzero": all(bool(g.abs().sum() > 0) for g in b_g),
    }
    # All-zero gradients would make the comparison vacuous.
    result["ok"] = result["grads_nonzero"] and lp_diff <= tol["logprob_atol"]
    result["ok"] = result["ok"] and max(rel) <= tol["grad_rel_l2"]
    return result


def check_scoring(agents: list[LLMAgent], vocab: int, tol: dict) -> dict[str, Any]:
    """Prefix-shared against the plain pass; with two adapter agents, rows alternating between
    them in one mixed pass, also against each agent scoring its own rows alone."""
    prompts, completions = scoring_rows(agents[0], vocab)
    batch = build_batch(prompts, completions, agents[0].pad_token_id).to(agents[0].device)
    names = None
    if len(agents) > 1:
        names = [agents[i % len(agents)].adapter for i in range(len(prompts))]
    plain = scored(agents, batch, names, shared=False)
    result: dict[str, Any] = {
        "rows": len(prompts),
        "prefix_shared_vs_plain": compare(scored(agents, batch, names, shared=True), plain, tol),
    }
    if names is not None:
        alone = scored(agents, batch, "alone", shared=False)
        result["mixed_vs_each_adapter_alone"] = compare(plain, alone, tol)
    result["ok"] = all(v["ok"] for v in result.values() if isinstance(v, dict))
    return result


def run_equalities(size: Size, tokenizer: Any, device: str, dtype: torch.dtype) -> dict:
    tol = tolerance(dtype, device)
    agents = adapter_team(size, tokenizer, device, dtype)
    vocab = len(tokenizer)
    tokens = min(size.tokens, 16)
    full = LLMAgent(build_model(size, vocab, dtype, device, seed=5), tokenizer)
    full_tol = tolerance(full.model.dtype, device)
    result = {
        "tolerances": {"adapters": tol, "full_model": full_tol},
        "mixed_adapter_generation": check_generation(agents, tokens, tol),
        "mixed_adapter_scoring": check_scoring(agents, vocab, tol),
        "full_model_scoring": check_scoring([full], vocab, full_tol),
    }
    result["failures"] = [
        f"equality failed: {key} {value}"
        for key, value in result.items()
        if isinstance(value, dict) and value.get("ok") is False
    ]
    return result
