"""Evaluation metrics for the code tasks: pass@k and the level breakdown.

``pass_at_k(n, c, k)`` is the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``
for ``n`` samples of which ``c`` pass every test. ``code_eval_logger`` and
``code_eval_aggregator`` plug into MAGRPO's ``eval_logger``/``eval_aggregator`` hooks: per turn,
``turn_k/pass@1``, ``turn_k/test_pass_rate``, ``turn_k/reward`` and one ``turn_k/level/<name>``
per reward level (the trainer adds ``eval/``). Evaluation samples one answer per problem, so
the hooks report pass@1; for pass@k with k > 1 sample ``n >= k`` answers per problem and call
``pass_at_k_mean``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from cmlrl_env.code_reward import (
    CODE_LEVELS,
    CodeScore,
    extract_code,
    score_batch,
    split_single_program,
)
from cmlrl_env.code_tasks import problem_of

__all__ = ["pass_at_k", "pass_at_k_mean", "code_eval_logger", "code_eval_aggregator"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of the ``n`` samples passes, ``c`` passing."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"pass_at_k: {name} must be an int >= 0, got {value!r}.")
    if not 1 <= k <= n or c > n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n and c <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the ratio of binomials without big integers.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_mean(samples: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as ``(n, c)`` pairs."""
    if not samples:
        raise ValueError("pass_at_k_mean needs at least one (n, c) pair.")
    return sum(pass_at_k(n, c, k) for n, c in samples) / len(samples)


def _scores_of_turn(
    completions: Sequence[Sequence[Sequence[str]]], items: Sequence[Mapping[str, Any]], turn: int
) -> list[CodeScore | None]:
    out: list[CodeScore | None] = []
    for i, item in enumerate(items):
        problem = problem_of(item)
        answers = [completions[a][i] for a in range(len(completions))]
        if problem is None or any(len(chain) <= turn for chain in answers):
            out.append(None)  # no such problem, or the branch ended before this turn
            continue
        if len(completions) == 1:
            helper, main = split_single_program(extract_code(answers[0][turn]))
        else:
            helper, main = answers[0][turn], answers[1][turn]
        out.append(score_batch(problem, [helper], [main])[0])
    return out


def code_eval_logger(
    *,
    agent_completions_turns: Sequence[Sequence[Sequence[str]]],
    batch_items: Sequence[Mapping[str, Any]],
    prompts: Sequence[Any] | None = None,
) -> list[dict[str, float]]:
    """One row per evaluated item: per turn its pass flag, test pass rate, reward and levels.

    ``agent_completions_turns[agent][item][turn]`` from two agents (helper, main) or one agent
    (both functions in one program)."""
    if len(agent_completions_turns) not in (1, 2):
        raise ValueError(
            f"code_eval_logger scores 1 or 2 agents, got {len(agent_completions_turns)}."
        )
    rows: list[dict[str, float]] = [{} for _ in batch_items]
    turns = max((len(c) for agent in agent_completions_turns for c in agent), default=0)
    for turn in range(turns):
        for row, score in zip(
            rows, _scores_of_turn(agent_completions_turns, batch_items, turn), strict=True
        ):
            if score is None:
                continue
            key = f"turn_{turn + 1}"
            row[f"{key}/passed"] = float(score.passed_all)
            row[f"{key}/test_pass_rate"] = score.pass_rate
            row[f"{key}/reward"] = score.reward
            for level in CODE_LEVELS:
                row[f"{key}/level/{level}"] = score.levels.get(level, 0.0)
    return rows


def code_eval_aggregator(
    rows: Sequence[Mapping[str, float]], *, num_turns: int
) -> dict[str, float]:
    """Means over the rows; ``turn_k/passed`` becomes ``turn_k/pass@1`` (one sample each)."""
    values: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            values[key].append(value)
    out = {}
    for key, vals in values.items():
        name = key.replace("/passed", "/pass@1")
        out[name] = sum(vals) / len(vals)
    return out
