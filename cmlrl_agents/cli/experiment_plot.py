"""The experiment's plot: eval reward against training tokens generated, one panel per task,
one line per method (mean over seeds at each eval point, error bars one standard error over
seeds, or the eval's own with one seed), the untrained team's reward as a dotted line and the
reward's maximum as a dashed one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cmlrl_agents.cli.experiment_eval import mean_se

__all__ = ["plot_results"]

COLOURS = {"team": "tab:blue", "centralized": "tab:orange", "single": "tab:green"}
COLOURS["baseline"] = "tab:purple"  # another task's team, e.g. the 1-turn team of 2-turn code


def _curve(results: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """(mean training tokens, mean reward, its standard error) at each eval point, over seeds."""
    points = min(len(r["points"]) for r in results)
    xs, ys, es = [], [], []
    for i in range(points):
        at = [r["points"][i] for r in results]
        xs.append(sum(p["train_tokens"] for p in at) / len(at))
        mean, se = mean_se([p["reward"] for p in at])
        ys.append(mean)
        es.append(at[0]["reward_se"] if len(at) == 1 else se)
    return xs, ys, [0.0 if math.isnan(e) else e for e in es]


def plot_results(plan: Any, results: list[dict[str, Any]], path: Path) -> Path:
    """Draw every task's curves into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cmlrl_env.code_tasks import CODE_REWARD_MAX
    from cmlrl_env.writing_tasks import WRITING_REWARD_MAX

    maximum = {"code": CODE_REWARD_MAX, "writing": WRITING_REWARD_MAX}
    tasks = list(plan.tasks)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        lines = {
            m: [r for r in results if r["task"] == task and r["method"] == m]
            for m in plan.tasks[task]["methods"]
        }
        baseline = plan.tasks[task]["baseline"]
        if baseline is not None:
            team = [r for r in results if r["task"] == baseline and r["method"] == "team"]
            lines[f"team of {baseline}"] = team
        for label, found in lines.items():
            if found:
                xs, ys, es = _curve(found)
                colour = COLOURS.get(label, COLOURS["baseline"])
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label, color=colour)
        if lines.get("team"):
            untrained = _curve(lines["team"])[1][0]
            ax.axhline(untrained, color="grey", linestyle=":", label="untrained team")
        top = maximum[plan.tasks[task]["kind"]]
        ax.axhline(top, color="black", linestyle="--", lw=0.8, label="maximum")
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), top * 1.05)  # 0 to the maximum, and below
        ax.set_title(task)
        ax.set_xlabel("training tokens generated")
        ax.set_ylabel("eval reward (last turn)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
