"""LLM-policy agents and learners that train on ``cmlrl_env.CoMLRLEnv``."""

from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer, RolloutSample
from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.algorithms.actor_critic_learner import ActorCriticBatch, ActorCriticLearner
from cmlrl_agents.algorithms.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
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
