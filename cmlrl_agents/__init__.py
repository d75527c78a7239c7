"""LLM-policy agents and learners that train on ``cmlrl_env.CoMLRLEnv``.

The public names are imported on first use (``from cmlrl_agents import MAGRPOTrainer`` works as
ever), so that ``import cmlrl_agents.cli`` or ``cmlrl --help`` does not load torch,
transformers and peft. The imports under ``TYPE_CHECKING`` say where each name lives: type
checkers and the API reference read them, and ``__getattr__`` imports from them on use.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer, RolloutSample
    from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
    from cmlrl_agents.algorithms.actor_critic_learner import ActorCriticBatch, ActorCriticLearner
    from cmlrl_agents.algorithms.centralized import (
        CentralizedMAGRPOConfig,
        CentralizedMAGRPOTrainer,
    )
    from cmlrl_agents.algorithms.madpo import MADPOTrainer
    from cmlrl_agents.algorithms.magrpo import (
        MAGRPOTrainer,
        MAREINFORCETrainer,
        MAReMaxTrainer,
        MARLOOTrainer,
    )
    from cmlrl_agents.algorithms.magrpo_config import (
        MAGRPOConfig,
        MAREINFORCEConfig,
        MAReMaxConfig,
        MARLOOConfig,
    )
    from cmlrl_agents.algorithms.marlhf import MARLHFTrainer
    from cmlrl_agents.algorithms.policy_gradient import PolicyGradientLearner
    from cmlrl_agents.algorithms.preference_config import (
        MADPOConfig,
        MADPOIterConfig,
        MARLHFConfig,
        MARLHFIterConfig,
    )
    from cmlrl_agents.algorithms.preference_judge import LLMJudge
    from cmlrl_agents.algorithms.preference_pairs import PreferencePair, load_pairs, save_pairs
    from cmlrl_agents.algorithms.reward_model import PreferenceRewardModel
    from cmlrl_agents.policies.agent import Completion, LLMAgent, SamplingConfig, smollm2_path
    from cmlrl_agents.policies.scripted import ScriptedLLMAgent, ScriptedPolicy
    from cmlrl_agents.policies.value_head import ValueHead, ValueModel
    from cmlrl_agents.runs.tree_plot import draw_rollout_tree, save_rollout_tree, write_tree_html
    from cmlrl_agents.runs.tree_view import TreeNode, TreeView, rollout_tree_view

__all__ = [
    "ActorCriticBatch",
    "ActorCriticLearner",
    "PolicyGradientLearner",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "Completion",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "RolloutSample",
    "ValueHead",
    "ValueModel",
    "LLMAgent",
    "LLMJudge",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFTrainer",
    "PreferenceRewardModel",
    "PreferencePair",
    "load_pairs",
    "save_pairs",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "SamplingConfig",
    "ScriptedLLMAgent",
    "ScriptedPolicy",
    "smollm2_path",
    "TreeNode",
    "TreeView",
    "draw_rollout_tree",
    "rollout_tree_view",
    "save_rollout_tree",
    "write_tree_html",
]


@functools.cache
def _modules() -> dict[str, str]:
    """Each public name's module, read from the ``TYPE_CHECKING`` imports above (one list to
    keep, not two)."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    module = _modules().get(name) if name in __all__ else None
    if module is None:
        raise AttributeError(f"module 'cmlrl_agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
