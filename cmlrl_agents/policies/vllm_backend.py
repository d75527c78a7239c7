"""The optional vLLM generation backend (``generation_backend="vllm"``, extra ``cmlrl[vllm]``).

vLLM serves the shared base once and each adapter agent's LoRA per request (``LoRARequest``),
all of a level's requests in ONE ``LLM.generate`` call (per-request sampling settings included).
``sync(agents)`` saves every adapter to a fresh folder after each update and serves the new
version under a new LoRA id (vLLM caches adapters by id). It serves adapter agents
(``peft_config``) only: fully fine-tuned agents keep the default ``"hf"`` backend. This module is
imported only when the backend is chosen; without vLLM it raises with the install command.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cmlrl_agents.policies.agent import Completion, LLMAgent, SamplingConfig
from cmlrl_agents.policies.generation import GenerationRequest

__all__ = ["VLLMGenerate", "vllm_sampling"]


def vllm_sampling(
    sampling: SamplingConfig, n: int, eos: Sequence[int], seed: int | None = None
) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords for ``sampling`` (``top_k`` -1 is vLLM's "off"), with
    the sampled tokens' log-probs (``logprobs=0``: the learner's truncated importance weights
    correct for vLLM's numerics) and the prompt's sampling key as its seed."""
    greedy = not sampling.do_sample
    return {
        "logprobs": 0,
        "seed": seed,
        "n": n,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": -1 if greedy or sampling.top_k is None else sampling.top_k,
        "max_tokens": sampling.max_new_tokens,
        "min_tokens": sampling.min_new_tokens,
        "stop_token_ids": sorted(eos),
        "skip_special_tokens": True,
    }


class VLLMGenerate:
    """vLLM over the adapter agents' shared base; ``llm_kwargs`` go to ``vllm.LLM``."""

    def __init__(self, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError:
            raise ImportError(
                "generation_backend='vllm' needs vLLM: pip install 'cmlrl[vllm]' (or use the "
                "default generation_backend='hf')."
            ) from None
        self._vllm = vllm
        # The log-probs of the distribution vLLM drew from (after temperature, top-k, top-p):
        # the learner's truncated importance weights compare the trainer's own of that
        # distribution with them. The default, raw_logprobs (temperature 1, untruncated),
        # biased the weights above 1 (TRL set the same).
        self._llm_kwargs = {"enable_lora": True, "logprobs_mode": "processed_logprobs"}
        self._llm_kwargs.update(llm_kwargs)
        self._llm: Any = None
        self._folder = Path(tempfile.mkdtemp(prefix="cmlrl-vllm-"))
        self._version = 0
        self._loras: dict[str, Any] = {}

    def _start(self, agents: Sequence[Any]) -> None:
        for i, agent in enumerate(agents):
            if not isinstance(agent, LLMAgent) or agent.adapter is None:
                raise TypeError(
                    f"generation_backend='vllm' serves LoRA adapter agents (peft_config=...), "
                    f"and agents[{i}] is not one; train it with peft_config or use "
                    "generation_backend='hf'."
                )
        if len({id(a.model) for a in agents}) > 1:
            raise ValueError(
                "generation_backend='vllm' serves one shared base; these agents have several. "
                "Use agent_model=... with peft_config, or generation_backend='hf'."
            )
        base = agents[0].model.get_base_model().config.name_or_path
        rank = max(c.r for c in agents[0].model.peft_config.values())
        self._llm = self._vllm.LLM(model=base, max_lora_rank=rank, **self._llm_kwargs)
        self.sync(agents)

    def generate(
        self, agents: Sequence[Any], requests: Sequence[GenerationRequest]
    ) -> list[list[list[Completion]]]:
        if self._llm is None:
            self._start(agents)
        from vllm.inputs import TokensPrompt

        prompts, params, loras, ids = [], [], [], []
        for r in requests:
            agent = agents[r.agent]
            for p, row in enumerate(agent.encode_prompts(list(r.prompts))):
                seed = None if r.keys is None else r.keys[p * r.num_samples]
                kwargs = vllm_sampling(r.sampling, r.num_samples, agent.eos_token_ids, seed)
                prompts.append(TokensPrompt(prompt_token_ids=row))
                params.append(self._vllm.SamplingParams(**kwargs))
                loras.append(self._loras[agent.adapter])
                ids.append(row)
        outputs = self._llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        flat = [
            [_completion(agents[0], row, sample) for sample in out.outputs]
            for row, out in zip(ids, outputs, strict=True)
        ]
        result, start = [], 0
        for r in requests:
            result.append(flat[start : start + len(r.prompts)])
            start += len(r.prompts)
        return result

    def sync(self, agents: Sequence[Any]) -> None:
        """Serve the agents' current adapters: saved to a new folder under a new LoRA id."""
        if self._llm is None:
            return  # started (and synced) at the first generate
        self._version += 1
        request = self._vllm.lora.request.LoRARequest
        for i, agent in enumerate(agents):
            folder = self._folder / f"v{self._version}"
            agent.model.save_pretrained(folder, selected_adapters=[agent.adapter])
            lora_id = self._version * len(agents) + i + 1
            self._loras[agent.adapter] = request(
                f"{agent.adapter}-v{self._version}", lora_id, str(folder / agent.adapter)
            )


def _completion(agent: LLMAgent, prompt: Sequence[int], sample: Any) -> Completion:
    """vLLM's sample as a :class:`Completion`, with the sampler's log-prob of each token
    (``sample.logprobs``: per position a dict from token id to an object with ``logprob``)."""
    ids = tuple(sample.token_ids)
    finished = bool(ids) and ids[-1] in agent.eos_token_ids
    logprobs = None
    if getattr(sample, "logprobs", None) is not None:
        logprobs = tuple(
            float(pos[tok].logprob) for pos, tok in zip(sample.logprobs, ids, strict=True)
        )
    return Completion(sample.text, tuple(prompt), ids, finished, logprobs)
