"""A round's policy steps, the one loop of the MAGRPO family and the actor-critics.

A round's rows are stepped on in the windows its batch carries (``items_per_step`` items of
every rank's items under torchrun: :meth:`PolicyLearner.windows`), ``ppo_epochs`` times over
(:func:`round_steps`).
When that makes more than one step, the later ones train on samples of a policy that has since
moved, so every row keeps its log-probs from before the first step and the loss compares with
them (PPO's clipped ratio); :class:`PolicyRound` takes them once, then runs each step of each
group of agents (``adapters.step_groups``: the adapter agents of one base step together)
through the one engine. :class:`PolicyLearner` is what both families' learners share to build it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

import torch

from cmlrl_agents.foundation.distributed import DataParallel
from cmlrl_agents.learning.batch import PolicyRow, Windows
from cmlrl_agents.learning.engine import StepEngine, mean_metrics
from cmlrl_agents.learning.learner import C, OptimizedLearner
from cmlrl_agents.learning.policy_loss import OldScores, PolicyObjective
from cmlrl_agents.learning.policy_metrics import policy_metrics
from cmlrl_agents.learning.policy_step import PolicyStep
from cmlrl_agents.policies.adapters import step_groups
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.policies.value_head import ValueModel

__all__ = ["PolicyLearner", "PolicyRound", "round_steps"]


def round_steps(windows: Sequence[Sequence[int]], epochs: int) -> list[set[int]]:
    """A round's optimizer steps in order, each as the item slots it trains on: every window
    of the round, ``epochs`` times over."""
    return [set(window) for _ in range(epochs) for window in windows]


class PolicyRound:
    """One round's policy steps over ``rows`` (``steps``: the item slots of each, in order).

    ``step(s, group)`` is one optimizer step of ``group`` on step ``s``'s rows; it records the
    step's metrics, and ``metrics()`` gives each one's mean over the round. Steps of different
    groups touch different models, so a learner may order them as it likes (the actor-critics
    put their critics' steps between).
    """

    def __init__(
        self,
        learner: PolicyLearner[Any],
        policy: PolicyStep,
        rows: Sequence[PolicyRow],
        steps: Sequence[Collection[int]],
        *,
        loss_key: str = "loss",
    ) -> None:
        self.learner = learner
        self.policy = policy
        self.rows = rows
        self.steps = steps
        self.loss_key = loss_key
        """The name of an agent's policy loss in the metrics (the actor-critics': ``policy_loss``,
        beside their ``value_loss``)."""
        self.chunk_size: int | None = learner.args.forward_batch_size
        self.per_step: dict[str, list[float]] = defaultdict(list)
        """Each metric's value at every step so far."""
        self._agent_rows: dict[int, list[int]] = defaultdict(list)
        for i, row in enumerate(rows):
            self._agent_rows[row.agent].append(i)
        self.old: dict[int, OldScores] | None = None
        """Every row's log-probs before the round's first step, when it has later ones."""
        if len(steps) > 1:
            self.old = {}
            for group in self.groups:
                mine = self._rows_of(group)
                self.old.update(
                    self.policy.old_logprobs(group, rows, mine, self.chunk_size, steps[0])
                )

    @property
    def groups(self) -> list[list[int]]:
        """The agents that step together."""
        return self.learner.agent_groups()

    def _rows_of(self, group: Sequence[int]) -> list[list[int]]:
        """Per agent of ``group``: the indices of its rows."""
        return [self._agent_rows[a] for a in group]

    def step(
        self, s: int, group: Sequence[int], heads: Sequence[ValueModel | None] | None = None
    ) -> None:
        """Step ``s`` of ``group`` (``heads``: a value head per agent, trained in the same
        step by the agent's optimizer)."""
        learner, slots = self.learner, self.steps[s]
        mine = self._rows_of(group)
        window = [[i for i in rows if self.rows[i].item_slot in slots] for rows in mine]
        plan = self.policy.plan(
            group,
            self.rows,
            window,
            {f"agent_{a}": learner.optimizers[a] for a in group},
            chunk_size=self.chunk_size,
            old=self.old,
            record_old=self.old is not None and s == 0,
            heads=heads,
        )
        result = learner.engine.step(
            plan, max_grad_norm=learner.args.max_grad_norm, schedulers=learner.schedulers
        )
        objective, turns = self.policy.objective, self.policy.num_turns
        for name, values in policy_metrics(
            result.stats, result.totals, group, objective, turns
        ).items():
            for key, value in values.items():
                self.per_step[f"{name}/{self.loss_key if key == 'loss' else key}"].append(value)

    def metrics(self) -> dict[str, float]:
        """Each metric's mean over the round's steps."""
        return mean_metrics(self.per_step)


class PolicyLearner(OptimizedLearner[C]):
    """A learner of LLM policies stepped in rounds: its agents, their optimizers and frozen
    references, the engine and this process's share of a data parallel launch."""

    agents: list[LLMAgent]
    optimizers: list[torch.optim.Optimizer]
    reference_models: list[Reference] | None
    num_turns: int
    """The task's turns (the task spec owns them; fixed for the learner's life)."""
    parallel: DataParallel
    engine: StepEngine

    def agent_groups(self) -> list[list[int]]:
        """The agents that step together: the adapter agents of one base in one mixed-adapter
        pass, any other agent alone (``adapters.step_groups``)."""
        return step_groups(self.agents)

    def policy_step(self, objective: PolicyObjective) -> PolicyStep:
        """The policy part of a step with ``objective``'s loss, its passes under the engine's
        precision (so a round's old log-probs are the loss's function)."""
        return PolicyStep(
            self.agents,
            self.reference_models,
            objective,
            self.num_turns,
            precision=self.engine.autocast,
        )

    def windows(self, num_items: int) -> Windows:
        """The item slots of each optimizer step of one pass over a round of which this process
        holds ``num_items`` items: windows of ``items_per_step`` items of the whole round (an
        all-reduce under torchrun, where a window may hold none of this rank's items)."""
        round_items = int(self.parallel.sum(num_items))
        windows = self.parallel.windows(round_items, self.args.items_per_step)
        return tuple(tuple(window) for window in windows)

    def policy_round(
        self,
        rows: Sequence[PolicyRow],
        windows: Windows,
        objective: PolicyObjective,
        epochs: int,
        *,
        loss_key: str = "loss",
    ) -> PolicyRound:
        """The round's steps with ``objective``'s loss over ``rows``: every window, ``epochs``
        times over (every rank takes part in each step, even one without items)."""
        steps = round_steps(windows, epochs)
        return PolicyRound(self, self.policy_step(objective), rows, steps, loss_key=loss_key)
