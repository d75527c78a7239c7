"""One generation batch for the adapter agents of a shared base, per-agent sampling, backends."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from peft import LoraConfig

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.adapters import attach_adapters
from cmlrl_agents.policies.agent import Completion, SamplingConfig
from cmlrl_agents.policies.generation import GenerationBackend, GenerationRequest, HFGenerate
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import tasks
from cmlrl_env.core import Task

# init_lora_weights=False: random adapters, so the two agents answer differently.
LORA = LoraConfig(
    r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False
)
GREEDY = SamplingConfig(max_new_tokens=5, do_sample=False)
FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def adapter_team(seed: int = 0):
    base = tiny_agent(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return attach_adapters([base, base], [LORA, LORA])


def two_turn_task() -> Task:
    return Task(
        FORMATTERS,
        tasks.length_ratio_reward,
        num_turns=2,
        external_transition=tasks.length_feedback,
        early_termination_threshold=None,
    )


def items(n: int = 2):
    data = tasks.length_ratio_dataset()
    return [(data[i], i) for i in range(n)]


class CountingGenerate:
    """Wraps a model's (peft's) ``generate`` to count the calls made on it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.inner = model.generate
        model.generate = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_one_generate_call_per_level_for_adapter_agents_with_equal_settings():
    team = adapter_team()
    counter = CountingGenerate(team[0].model)
    tree = collect_tree(two_turn_task(), team, items(), num_generations=2, sampling=GREEDY)
    assert len(tree.levels) == 2
    assert counter.calls == 2  # one call per level for both agents (rows 2 items x G=2 x 2)


def test_batched_generation_equals_per_agent_calls_completions_and_logprobs():
    team = adapter_team()
    tree = collect_tree(two_turn_task(), team, items(), num_generations=2, sampling=GREEDY)
    alone = adapter_team()  # the same weights, generating agent by agent
    for level in tree.levels:
        for a, agent in enumerate(alone):
            prompts = [state.prompts[a] for state in level.states]
            single = agent.generate(prompts, 2, GREEDY)
            assert [[c.completion_ids for c in row] for row in single] == [
                [c.completion_ids for c in row] for row in level.completions[a]
            ]
            flat = [c for row in level.completions[a] for c in row]
            batched_lp = team[a].logprobs(
                [c.prompt_ids for c in flat], [c.completion_ids for c in flat]
            )
            single_lp = agent.logprobs(
                [c.prompt_ids for c in flat], [c.completion_ids for c in flat]
            )
            torch.testing.assert_close(batched_lp, single_lp, rtol=0, atol=1e-6)
    # The adapters differ, so the mixed batch did not answer both agents with one adapter.
    first = tree.levels[0]
    assert first.completions[0][0][0].completion_ids != first.completions[1][0][0].completion_ids


def test_different_settings_take_one_call_each_and_are_honoured():
    team = adapter_team()
    counter = CountingGenerate(team[0].model)
    short = SamplingConfig(max_new_tokens=2, do_sample=False)
    long = SamplingConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    tree = collect_tree(two_turn_task(), team, items(), num_generations=2, sampling=[short, long])
    assert counter.calls == 4  # two settings x two levels
    for level in tree.levels:
        assert all(len(c.completion_ids) <= 2 for row in level.completions[0] for c in row)
        assert all(len(c.completion_ids) == 6 for row in level.completions[1] for c in row)


def test_agents_with_their_own_models_keep_one_call_each():
    agents = [tiny_agent(0), tiny_agent(1)]
    counters = [CountingGenerate(a.model) for a in agents]
    collect_tree(two_turn_task(), agents, items(), num_generations=2, sampling=GREEDY)
    assert [c.calls for c in counters] == [2, 2]


def test_agent_sampling_config_is_validated():
    with pytest.raises(ValueError, match=r"agent_sampling\[1\] has unknown key\(s\) \['beams'\]"):
        MAGRPOConfig(agent_sampling=[{}, {"beams": 2}])
    with pytest.raises(ValueError, match=r"agent_sampling\[0\]=\{'top_p': 1.5\}: top_p=1.5"):
        MAGRPOConfig(agent_sampling=[{"top_p": 1.5}, {}])
    with pytest.raises(ValueError, match="agent_sampling has 1 entries but num_agents=2"):
        MAGRPOConfig(num_agents=2, agent_sampling=[{}])
    with pytest.raises(TypeError, match="agent_sampling must be None or a list of dicts"):
        MAGRPOConfig(agent_sampling={"temperature": 0.5})
    config = MAGRPOConfig(temperature=0.7, agent_sampling=[{}, {"temperature": 1.0}])
    assert config.sampling_for(0).temperature == 0.7
    assert config.sampling_for(1) == SamplingConfig(
        max_new_tokens=128, temperature=1.0, top_p=0.6, top_k=50
    )
    with pytest.raises(ValueError, match="unknown generation_backend|generation_backend"):
        MAGRPOConfig(generation_backend="sglang")


def test_trainer_refuses_agent_sampling_of_the_wrong_length(tmp_path):
    tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match="args.agent_sampling has 3 entries for 2 agents"):
        MAGRPOTrainer(
            agents=[tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 1)],
            tokenizer=tokenizer,
            formatters=FORMATTERS,
            reward_func=tasks.length_ratio_reward,
            args=MAGRPOConfig(agent_sampling=[{}, {}, {}], output_dir=str(tmp_path)),
        )


class FixedTextBackend:
    """A backend of its own: every agent answers "a b c" (agent 0) or "a b" (agent 1)."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []
        self.synced: list[list[object]] = []

    def generate(
        self, agents: Sequence[object], requests: Sequence[GenerationRequest]
    ) -> list[list[list[Completion]]]:
        out = []
        for r in requests:
            self.requests.append(r)
            agent = agents[r.agent]
            text = "a b c" if r.agent == 0 else "a b"
            ids = agent.tokenizer(text, add_special_tokens=False)["input_ids"]
            rows = agent.encode_prompts(list(r.prompts))
            out.append(
                [[Completion(text, tuple(p), tuple(ids), False)] * r.num_samples for p in rows]
            )
        return out

    def sync(self, agents: Sequence[object]) -> None:
        self.synced.append(list(agents))


def test_a_backend_of_our_own_generates_and_is_synced_after_each_update(tmp_path):
    tokenizer = tiny_tokenizer()
    trainer = MAGRPOTrainer(
        agents=[tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 1)],
        tokenizer=tokenizer,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(4)),
        args=MAGRPOConfig(
            num_generations=2,
            rollout_buffer_size=2,
            eval_interval=0,
            agent_sampling=[{"temperature": 0.5}, {}],
            output_dir=str(tmp_path / "run"),
        ),
    )
    assert isinstance(trainer.generation_backend, HFGenerate)
    backend = FixedTextBackend()
    assert isinstance(backend, GenerationBackend)
    trainer.generation_backend = backend
    metrics = trainer.train()
    assert len(backend.synced) == 2 and all(s == trainer.agents for s in backend.synced)
    assert len(backend.requests) == 4  # 2 rounds x 2 agents, one turn
    assert [r.sampling.temperature for r in backend.requests[:2]] == [0.5, 0.6]
    # length_ratio_reward scores the backend's fixed texts; every sibling is equal, so the
    # advantages are 0 and the loss is exactly 0 (the update still ran on those completions).
    assert metrics["loss"] == 0.0
    data = tasks.length_ratio_dataset()
    last_round = [
        tasks.length_ratio_reward(["a b c"], ["a b"], batch_items=[data[i]])[0] for i in (2, 3)
    ]
    assert metrics["turn_1/reward_mean"] == pytest.approx(sum(last_round) / 2)


def test_vllm_backend_needs_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        from cmlrl_agents.policies.backends import make_backend

        with pytest.raises(ImportError, match=r"pip install 'cmlrl\[vllm\]'"):
            make_backend("vllm")
        pytest.skip("vLLM is not installed: its backend is tested where it is")
    from cmlrl_agents.policies.vllm_backend import vllm_sampling

    assert vllm_sampling(GREEDY, 2, {7})["temperature"] == 0.0


def test_vllm_samples_carry_the_samplers_log_probs_and_keys_as_seeds() -> None:
    """The vLLM backend's pieces that need no vLLM: each sample's token log-probs become the
    completion's ``sampler_logprobs`` (the learner's truncated importance weights read them),
    and a prompt's sampling key is its request's seed."""
    from types import SimpleNamespace

    from cmlrl_agents.policies.vllm_backend import _completion, vllm_sampling

    agent = tiny_agent()
    eos = min(agent.eos_token_ids)
    sample = SimpleNamespace(
        text="hi",
        token_ids=[5, 6, eos],
        logprobs=[
            {t: SimpleNamespace(logprob=lp)} for t, lp in ((5, -0.5), (6, -1.25), (eos, -2.0))
        ],
    )
    completion = _completion(agent, [1, 2], sample)
    assert completion.sampler_logprobs == (-0.5, -1.25, -2.0) and completion.finished
    params = vllm_sampling(SamplingConfig(max_new_tokens=4), 2, {eos}, seed=123)
    assert params["seed"] == 123 and params["logprobs"] == 0
