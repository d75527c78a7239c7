"""``MAGRPOTrainer`` and its REINFORCE-family siblings (MAREINFORCE, MAReMax, MARLOO).

One round: roll out ``rollout_buffer_size`` task items through the env's tree (one batched
generate per agent and turn), compute tree returns and sibling-group advantages (pure functions),
then for each agent one optimizer step per ``train_batch_size`` items, each step's loss from
batched padded forwards.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset

from cmlrl_agents._checks import finite_metrics
from cmlrl_agents.advantages import group_advantages
from cmlrl_agents.devices import resolve_devices
from cmlrl_agents.losses import kl_k3, policy_gradient_loss
from cmlrl_agents.magrpo_config import (
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from cmlrl_agents.optim import clip_and_step, make_adamw
from cmlrl_agents.rollout import RolloutTree, collect_tree
from cmlrl_agents.tokens import build_batch, sequence_logprobs
from cmlrl_agents.trainer_base import Item, TeamTrainer, turn_metrics
from cmlrl_agents.tree_plot import save_rollout_tree
from cmlrl_agents.tree_view import rollout_tree_view
from cmlrl_env import CoMLRLEnv

__all__ = [
    "MAGRPOTrainer",
    "MAREINFORCETrainer",
    "MAReMaxTrainer",
    "MARLOOTrainer",
    "Sample",
    "agent_samples",
    "eval_chains",
]


@dataclass(frozen=True)
class Sample:
    """One completion of one agent with its advantage: a row of the policy-gradient batch."""

    item_slot: int
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float


def agent_samples(
    tree: RolloutTree,
    agent: int,
    agent_returns: list[torch.Tensor],
    advantage_mode: str,
    advantage_normalization: bool,
) -> list[Sample]:
    """Every completion of ``agent`` in the tree, its advantage taken over its G siblings."""
    samples = []
    for level, returns in zip(tree.levels, agent_returns, strict=True):
        adv = group_advantages(returns[:, agent, :], advantage_mode, advantage_normalization)
        for branch, row in enumerate(level.completions[agent]):
            for g, completion in enumerate(row):
                samples.append(
                    Sample(
                        level.item_slot[branch],
                        level.turn,
                        completion.prompt_ids,
                        completion.completion_ids,
                        float(adv[branch, g]),
                    )
                )
    return samples


def eval_chains(tree: RolloutTree) -> list[list[list[str]]]:
    """Completions of a one-sample-per-turn tree as ``[agent][item][turn]``."""
    chains: list[list[list[str]]] = [[[] for _ in tree.items] for _ in range(tree.num_agents)]
    for level in tree.levels:
        for branch, slot in enumerate(level.item_slot):
            for a in range(tree.num_agents):
                chains[a][slot].append(level.completions[a][branch][0].text)
    return chains


class MAGRPOTrainer(TeamTrainer):
    """Multi-agent GRPO over ``CoMLRLEnv`` (SPEC §5–§6).

    Construct with ``agent_model="<hub id or folder>"`` (one copy per agent) or
    ``agents=[model, ...]`` plus ``tokenizer=``; the task as ``train_dataset``, ``formatters``,
    ``reward_func`` (``reward_processor``, ``external_transition``) or as a ready ``env=``.
    """

    algorithm = "magrpo"
    config_class: type[MAGRPOConfig] = MAGRPOConfig
    fixed_fields = (*TeamTrainer.fixed_fields, "reference_kl_enabled")

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: Mapping[str, Any] | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | None = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Any] | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: MAGRPOConfig | None = None,
        env: CoMLRLEnv | None = None,
    ) -> None:
        args = self.config_class() if args is None else args
        if not isinstance(args, MAGRPOConfig):
            raise TypeError(
                f"args must be a MAGRPOConfig (or a REINFORCE-family config), got "
                f"{type(args).__name__}."
            )
        if (eval_logger is None) != (eval_aggregator is None):
            raise ValueError("eval_logger and eval_aggregator work together: pass both or neither.")
        super().__init__(
            args=args,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            env=env,
            wandb_config=wandb_config,
        )
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.optimizers = [
            make_adamw(
                (p for p in agent.model.parameters() if p.requires_grad),
                args.agent_learning_rate,
                f"agents[{i}]",
            )
            for i, agent in enumerate(self.agents)
        ]
        devices = resolve_devices(args.reference_devices, self.num_agents, "reference_devices")
        self.reference_models = (
            [
                _frozen_copy(agent.model, None if devices is None else devices[i])
                for i, agent in enumerate(self.agents)
            ]
            if args.reference_kl_enabled
            else None
        )
        self.rounds = 0  # rounds trained by this object; tree_plot_interval counts them

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluate on the first ``num_eval_samples`` eval items (default
        ``args.eval_num_samples``); ``{}`` without an eval dataset."""
        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        return self.evaluate_items(n)

    def _items_per_batch(self) -> int:
        return self.args.rollout_buffer_size

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        """``eval_aggregator(eval_logger(...), num_turns=T)`` over every evaluated item."""
        if self.eval_logger is None or self.eval_aggregator is None:
            return {}
        completions: list[list[list[str]]] = [[] for _ in range(self.num_agents)]
        items: list[Mapping[str, Any]] = []
        for tree in trees:
            chains = eval_chains(tree)
            for a in range(self.num_agents):
                completions[a].extend(chains[a])
            items.extend(item for item, _ in tree.items)
        rows = self.eval_logger(
            agent_completions_turns=completions,
            batch_items=items,
            prompts=[item.get("prompt") for item in items],
        )
        return finite_metrics(
            self.eval_aggregator(rows, num_turns=self.args.num_turns), "eval_aggregator"
        )

    # -- one round ----------------------------------------------------------------------------
    def _train_batch(self, items: list[Item]) -> tuple[dict[str, float], int]:
        args = self.args
        tree = collect_tree(
            self.task,
            self.agents,
            items,
            num_generations=args.num_generations,
            sampling=self.sampling,
            joint_mode=args.joint_mode,
        )
        joint_returns = tree.returns(args.discount)
        if args.tree_plot_interval and self.rounds % args.tree_plot_interval == 0:
            self.save_tree(tree)
        self.rounds += 1
        metrics = turn_metrics(tree, joint_returns)
        agent_returns = tree.agent_returns(joint_returns)
        losses, norms = [], []
        for a in range(self.num_agents):
            samples = agent_samples(
                tree, a, agent_returns, args.advantage_mode, args.advantage_normalization
            )
            stats = self._update_agent(a, samples)
            for level, returns in zip(tree.levels, agent_returns, strict=True):
                stats[f"turn_{level.turn}/expected_return"] = float(returns[:, a].mean())
            metrics.update({f"agent_{a}/{k}": v for k, v in stats.items()})
            losses.append(stats["loss"])
            norms.append(stats["grad_norm"])
        metrics["loss"] = sum(losses) / len(losses)
        metrics["grad_norm"] = sum(norms) / len(norms)
        metrics.update(_kl_turn_means(metrics, self.num_agents))
        return metrics, tree.env_steps

    def save_tree(self, tree: RolloutTree) -> dict[str, Path]:
        """Draw the first item of ``tree`` with this trainer's return and advantage settings
        into ``run_dir/trees/env_step-<E>`` (``.json``, ``.html`` and, unless the tree is too big
        for one image, ``.png``); returns the paths by suffix."""
        args = self.args
        view = rollout_tree_view(
            tree,
            discount=args.discount,
            advantage_mode=args.advantage_mode,
            advantage_normalization=args.advantage_normalization,
            env_step=self.env_step,
        )
        return save_rollout_tree(view, self.run_dir / "trees" / f"env_step-{self.env_step:06d}")

    def _update_agent(self, a: int, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step per ``train_batch_size`` items; returns mean loss and grad norm."""
        per_step = self.args.items_per_step
        slots = sorted({s.item_slot for s in samples})
        stats: dict[str, list[float]] = defaultdict(list)
        for i in range(0, len(slots), per_step):
            chosen = set(slots[i : i + per_step])
            step_stats = self._optimizer_step(a, [s for s in samples if s.item_slot in chosen])
            for key, value in step_stats.items():
                stats[key].append(value)
        return {key: sum(v) / len(v) for key, v in stats.items()}

    def _optimizer_step(self, a: int, samples: list[Sample]) -> dict[str, float]:
        agent, optimizer, args = self.agents[a], self.optimizers[a], self.args
        agent.model.train()
        optimizer.zero_grad(set_to_none=True)
        total_tokens = sum(len(s.completion_ids) for s in samples)
        size = args.forward_batch_size or len(samples)
        loss_sum, kl_by_turn = 0.0, defaultdict(list)
        for start in range(0, len(samples), size):
            chunk = samples[start : start + size]
            loss, kl = self._chunk_loss(a, chunk, len(samples), total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            if kl is not None:
                for s, value in zip(chunk, kl.tolist(), strict=True):
                    kl_by_turn[s.turn].append(value)
        stats = {"loss": loss_sum, "grad_norm": clip_and_step(optimizer, args.max_grad_norm)}
        for turn, values in kl_by_turn.items():
            mean = sum(values) / len(values)
            stats[f"turn_{turn}/reference_kl_mean"] = mean
            stats[f"turn_{turn}/reference_kl_penalty_mean"] = args.reference_kl_coef * mean
        return stats

    def _chunk_loss(
        self, a: int, chunk: list[Sample], num_samples: int, total_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This chunk's share of the step loss, scaled so that chunking changes nothing."""
        agent, args = self.agents[a], self.args
        batch = build_batch(
            [s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], agent.pad_token_id
        ).to(agent.device)
        logprobs = sequence_logprobs(agent.model, batch)
        mask = batch.completion_mask
        advantages = torch.tensor([s.advantage for s in chunk], device=agent.device)
        if args.loss_aggregation == "sequence_sum":
            weight = len(chunk) / num_samples
        else:
            weight = float(mask.sum()) / max(total_tokens, 1)
        loss = policy_gradient_loss(logprobs, mask, advantages, args.loss_aggregation) * weight
        if self.reference_models is None:
            return loss, None
        reference = self.reference_models[a]
        with torch.no_grad():
            ref_device = next(reference.parameters()).device
            ref = sequence_logprobs(reference, batch.to(ref_device)).to(agent.device)
        kl = kl_k3(logprobs, ref, mask)
        # TRL-style: the KL to the frozen reference is a loss term (no extra policy forward).
        loss = loss + args.reference_kl_coef * kl.mean() * (len(chunk) / num_samples)
        return loss, kl.detach()


def _frozen_copy(model: torch.nn.Module, device: torch.device | None) -> torch.nn.Module:
    # Copied where the model is, then moved device to device (never through the CPU).
    ref = copy.deepcopy(model).eval()
    if device is not None:
        ref.to(device)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _kl_turn_means(metrics: dict[str, float], num_agents: int) -> dict[str, float]:
    """Team means of the per-agent reference-KL metrics under the seed's ``turn_k/…`` names."""
    out: dict[str, list[float]] = defaultdict(list)
    for key, value in metrics.items():
        if key.startswith("agent_") and "/reference_kl_" in key:
            out[key.split("/", 1)[1]].append(value)
    return {k: sum(v) / len(v) for k, v in out.items() if len(v) == num_agents}


class MAREINFORCETrainer(MAGRPOTrainer):
    algorithm = "mareinforce"
    config_class = MAREINFORCEConfig


class MAReMaxTrainer(MAGRPOTrainer):
    algorithm = "maremax"
    config_class = MAReMaxConfig


class MARLOOTrainer(MAGRPOTrainer):
    algorithm = "marloo"
    config_class = MARLOOConfig
