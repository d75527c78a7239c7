"""Metric names of SPEC §7 are built by functions, and looked up by name, never parsed back."""

from __future__ import annotations

from cmlrl_agents.foundation.metrics import reward_postfix, turn_key


def test_turn_key_builds_the_spec_names() -> None:
    assert turn_key(1, "reward_mean") == "turn_1/reward_mean"
    assert turn_key(2, "expected_return", "eval/") == "eval/turn_2/expected_return"


def test_the_progress_postfix_reads_each_turns_reward_mean() -> None:
    metrics = {
        "turn_1/reward_mean": 0.5,
        "turn_2/reward_mean": 0.25,
        "turn_1/expected_return": 0.75,
        "agent_0/turn_1/reward_mean": 9.0,  # an agent's, not the team's
        "loss": 1.0,
    }
    assert reward_postfix(metrics, num_turns=2) == {"turn_1": 0.5, "turn_2": 0.25}
    assert reward_postfix(metrics, num_turns=1) == {"turn_1": 0.5}
    assert reward_postfix({}, num_turns=3) == {}


def test_team_kl_means_cover_the_turns_every_agent_has() -> None:
    from cmlrl_agents.foundation.metrics import kl_turn_means, kl_turn_stats

    agent_0 = kl_turn_stats({1: [0.1, 0.3], 2: [0.5]}, coef=0.5)
    agent_1 = kl_turn_stats({1: [0.4]}, coef=0.5)
    assert agent_0 == {
        "turn_1/reference_kl_mean": 0.2,
        "turn_1/reference_kl_penalty_mean": 0.1,
        "turn_2/reference_kl_mean": 0.5,
        "turn_2/reference_kl_penalty_mean": 0.25,
    }
    metrics = {f"agent_0/{k}": v for k, v in agent_0.items()}
    metrics |= {f"agent_1/{k}": v for k, v in agent_1.items()}
    means = kl_turn_means(metrics, num_agents=2, num_turns=2)
    assert means == {
        "turn_1/reference_kl_mean": (0.2 + 0.4) / 2,
        "turn_1/reference_kl_penalty_mean": (0.1 + 0.2) / 2,
    }  # turn 2: agent_1 has no value there, so no team mean
