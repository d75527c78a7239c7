"""``check_task``: call a task's formatters, reward and transition on samples, without a model.

Users check a task before they spend GPU time on it (SPEC §4: "users can check task set,
formatters and reward without loading a model"). ``check_task`` binds the pieces exactly as the
env and the trainers do (``Task``), plays every turn of the first ``num_items`` task items with
sample completions, and collects *every* contract violation instead of stopping at the first.

It raises ``TaskCheckError`` (a ``ValueError``) listing all problems when there is at least one,
and otherwise returns a ``TaskReport`` whose ``str()`` summarises what ran, with warnings for
things that work but are probably not meant (a constant reward, a reward that depends on the
other responses in the call, multi-turn collapsed by the early-termination threshold).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from cmlrl_env._errors import describe_exception
from cmlrl_env.core import DEFAULT_EARLY_TERMINATION_THRESHOLD, EpisodeState, Task
from cmlrl_env.dataset import TaskSource
from cmlrl_env.spaces import TextSpace
from cmlrl_env.task_spec import TaskSpec

__all__ = ["TaskCheckError", "TaskReport", "check_task", "DEFAULT_SAMPLE_COMPLETIONS"]

T = TypeVar("T")

# Empty answers, short and long ones, non-ASCII text, and the kind of printable garbage that
# PettingZoo's tests send (action_space.sample()): a reward must cope with all of them.
DEFAULT_SAMPLE_COMPLETIONS: tuple[str, ...] = (
    "",
    "Hi",
    "Hello",
    "A somewhat longer answer, with several words and a comma, to vary the lengths.",
    "naïve café 🙂 中文",
    TextSpace(120, min_length=1, seed=0).sample(),
)


@dataclass(frozen=True)
class TaskReport:
    """What ``check_task`` found: ``problems`` break the contract, ``warnings`` look unintended."""

    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    checked: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"check_task: {len(self.problems)} problem(s), {len(self.warnings)} warning(s)"
        parts = [head]
        for title, lines in (
            ("Problems", self.problems),
            ("Warnings", self.warnings),
            ("Checked", self.checked),
        ):
            if lines:
                parts.append(f"{title}:\n" + "\n".join(f"  - {line}" for line in lines))
        return "\n".join(parts)


class TaskCheckError(ValueError):
    """``check_task`` found contract violations; ``report`` holds all of them."""

    def __init__(self, report: TaskReport) -> None:
        super().__init__(str(report))
        self.report = report


@dataclass
class _Recorder:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    first_error: BaseException | None = None
    constant: dict[float, list[int]] = field(default_factory=dict)
    """The items on which the reward gave one value to every sample, by value."""
    _warned: set[str] = field(default_factory=set)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warnings.append(message)

    def attempt(self, what: str, func: Callable[[], T]) -> T | None:
        """``func()``, or ``None`` with the error recorded as a problem of ``what``."""
        try:
            return func()
        except Exception as exc:  # the user's task failed: report it and keep checking the rest
            self.problems.append(f"{what}: {describe_exception(exc)}")
            self.first_error = self.first_error or exc
            return None

    def finish(self) -> TaskReport:
        report = TaskReport(tuple(self.problems), tuple(self.warnings), tuple(self.checked))
        if report.problems:
            raise TaskCheckError(report) from self.first_error
        return report


def _spec_pieces(spec: TaskSpec) -> dict[str, Any]:
    """The keyword arguments of ``check_task`` that a ``TaskSpec`` holds."""
    names: tuple[str, ...] = ("dataset", "formatters", "reward_func", "num_agents", "num_turns")
    names += ("external_transition", "reward_processor", "early_termination_threshold")
    return {name: getattr(spec, name) for name in names}


def check_task(
    dataset: Any,
    formatters: Any = None,
    reward_func: Callable[..., Any] | None = None,
    *,
    num_agents: int | None = None,
    num_turns: int = 1,
    external_transition: Callable[..., Any] | None = None,
    reward_processor: Callable[[float], float] | None = None,
    early_termination_threshold: float | None = DEFAULT_EARLY_TERMINATION_THRESHOLD,
    num_items: int = 3,
    sample_completions: Sequence[str] | Sequence[Sequence[str]] | None = None,
) -> TaskReport:
    """Check a task's pieces on the first ``num_items`` items, without a model.

    The arguments are those of ``CoMLRLEnv`` (and the trainers). ``sample_completions`` is
    either a list of strings, which the agents answer with in rotation (joint response ``j``
    gives agent ``a`` the string ``(j + a) % len``), or one list per agent of equal length (the
    joint responses, aligned). The default mixes empty, short, long, non-ASCII and random
    printable answers (``DEFAULT_SAMPLE_COMPLETIONS``), as PettingZoo's tests do.

    Every turn is played (the threshold is only used to warn when it would end every branch
    after turn 1). Raises ``TaskCheckError`` listing every problem; returns a ``TaskReport``.
    ``check_task(spec)`` checks a ``TaskSpec`` (its dataset and pieces).
    """
    if isinstance(dataset, TaskSpec):
        pieces = _spec_pieces(dataset)
        return check_task(**pieces, num_items=num_items, sample_completions=sample_completions)
    if isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"num_items must be an int >= 1, got {num_items!r}.")
    _check_sample_shape(sample_completions)
    rec = _Recorder()
    task = rec.attempt(
        "binding the task",
        lambda: Task(
            formatters,
            reward_func,  # type: ignore[arg-type]  # None: Task's error is reported as a problem
            num_agents=num_agents,
            num_turns=num_turns,
            external_transition=external_transition,
            reward_processor=reward_processor,
            early_termination_threshold=early_termination_threshold,
        ),
    )
    items = rec.attempt("reading the dataset", lambda: _first_items(dataset, num_items))
    if task is None or items is None:
        return rec.finish()
    task.early_termination_threshold = None  # bound and checked above; now play every turn
    joint = _joint_actions(sample_completions, task.num_agents)
    for n, (index, item) in enumerate(items):
        _check_item(task, index, item, joint, early_termination_threshold, rec, show=n == 0)
    for value, indices in rec.constant.items():
        rec.warnings.append(_constant_warning(task.reward.name, value, indices, sample_completions))
    return rec.finish()


def _constant_warning(name: str, value: float, indices: list[int], samples: object) -> str:
    """One warning for every item on which the reward gave ``value`` to every sample."""
    where = f"item {indices[0]}" if len(indices) == 1 else f"items {', '.join(map(str, indices))}"
    head = f"{where}: reward_func {name} gave {value} to every sample joint response"
    if samples is not None:
        return f"{head}; check that it reads the completions."
    return (
        f"{head}. The samples are check_task's generic ones (empty, short, non-ASCII and random "
        "text), not answers to the task: a reward that only credits real attempts (tests that "
        "pass, a length band) gives them all one value, and then this is expected. If it should "
        "tell them apart, check that it reads the completions; sample_completions=[...] checks "
        "it on answers of your own."
    )


def _first_items(dataset: Any, num_items: int) -> list[tuple[int, dict[str, Any]]]:
    return list(TaskSource(dataset).epoch_items(1, limit=num_items))


def _check_sample_shape(samples: object) -> None:
    """``sample_completions`` is None, a list of str, or a list of lists of str (checked before
    anything else runs, so a wrong argument never surfaces as a foreign error)."""
    if samples is None:
        return
    if isinstance(samples, str) or not isinstance(samples, Sequence) or not samples:
        raise TypeError(
            f"sample_completions must be a non-empty list of str, or one list per "
            f"agent; got {samples!r:.80}."
        )
    for i, entry in enumerate(samples):
        if isinstance(entry, str):
            continue
        if not isinstance(entry, Sequence) or not all(isinstance(t, str) for t in entry):
            raise TypeError(
                f"sample_completions[{i}] is {entry!r:.60}; each entry must be a str (a "
                "completion) or a list of str (one agent's completions)."
            )


def _joint_actions(
    samples: Sequence[str] | Sequence[Sequence[str]] | None, num_agents: int
) -> list[tuple[str, ...]]:
    samples = DEFAULT_SAMPLE_COMPLETIONS if samples is None else samples
    if isinstance(samples, str) or not isinstance(samples, Sequence) or not samples:
        raise TypeError(
            f"sample_completions must be a non-empty list of str, or one list per "
            f"agent; got {samples!r:.80}."
        )
    if any(isinstance(s, str) for s in samples) and not all(isinstance(s, str) for s in samples):
        raise TypeError(
            f"sample_completions mixes strings and lists; give a list of str or one "
            f"list per agent, got {samples!r:.80}."
        )
    if all(isinstance(s, str) for s in samples):
        pool = [s for s in samples if isinstance(s, str)]  # all of them
        return [
            tuple(pool[(j + a) % len(pool)] for a in range(num_agents)) for j in range(len(pool))
        ]
    lists = [list(s) for s in samples]
    if (
        len(lists) != num_agents
        or len({len(s) for s in lists}) != 1
        or not lists[0]
        or not all(isinstance(t, str) for s in lists for t in s)
    ):
        raise ValueError(
            f"sample_completions as per-agent lists needs {num_agents} non-empty "
            f"lists of str of equal length (one per agent), got {samples!r:.120}."
        )
    return list(zip(*lists, strict=True))


def _check_item(
    task: Task,
    index: int,
    item: Mapping[str, Any],
    joint: list[tuple[str, ...]],
    threshold: float | None,
    rec: _Recorder,
    *,
    show: bool = False,
) -> None:
    """Play every turn of one item; ``show``: add its later turns' prompts to the report."""
    attempts = [
        rec.attempt(
            f"item {index}, formatter of agent_{a}",
            partial(task.formatters.format, a, item, item_index=index),
        )
        for a in range(task.num_agents)
    ]
    prompts = [p for p in attempts if p is not None]
    if len(prompts) < len(attempts):
        return
    for a, prompt in enumerate(prompts):
        if not prompt.strip():
            rec.warnings.append(
                f"item {index}: the formatter of agent_{a} returned an empty prompt."
            )
    states: list[EpisodeState] = [task.initial_state(item, index)]
    rec.checked.append(f"item {index}: prompts of {[len(p) for p in prompts]} characters")
    for turn in range(1, task.num_turns + 1):
        where = f"item {index}, turn {turn}"
        outcomes = rec.attempt(
            f"{where}, scoring {len(states) * len(joint)} joint responses",
            partial(task.step_group, states, [joint] * len(states)),
        )
        if outcomes is None:
            return
        flat = [o for row in outcomes for o in row]
        rec.checked.append(f"{where}: {_summary([o.reward for o in flat])}")
        if turn == 1:
            _check_reward_consistency(task, index, item, joint, [o.raw_reward for o in flat], rec)
            _warn_if_collapsed(task, index, [o.reward for o in flat], threshold, rec)
        if show and flat[0].next_state is not None:
            _show_next_prompts(task, states[0], joint[0], flat[0].next_state, rec)
        states = [o.next_state for o in flat if o.next_state is not None][: len(joint)]
        if not states:
            return


def _show_next_prompts(
    task: Task, state: EpisodeState, action: tuple[str, ...], after: EpisodeState, rec: _Recorder
) -> None:
    """What each agent reads at the next turn of the first branch, and whether its formatter
    changed the transition's prompt (it applies to every turn's prompt, not only the first)."""
    transition = task.transition
    assert transition is not None  # a next state exists only with a transition
    raw = rec.attempt(
        f"item {state.item_index}, turn {after.turns_played + 1}, the transition again",
        lambda: transition(
            state.item,
            action,
            prompt_history=state.prompt_history,
            response_history=after.response_history,
            item_index=state.item_index,
        ),
    )
    for a, prompt in enumerate(after.prompts):
        if raw is None:
            how = ""
        elif raw[a] == prompt:
            how = " (the transition's prompt as it returned it)"
        else:
            how = f" (the transition's prompt after agent_{a}'s formatter)"
        rec.checked.append(
            f"item {state.item_index}, turn {after.turns_played + 1}, agent_{a} reads "
            f"{_head(prompt)}{how}"
        )


def _head(text: str, limit: int = 160) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f" ... ({len(text)} chars)"


def _check_reward_consistency(
    task: Task,
    index: int,
    item: Mapping[str, Any],
    joint: list[tuple[str, ...]],
    group: list[float],
    rec: _Recorder,
) -> None:
    def score(actions: list[tuple[str, ...]]) -> list[float]:
        return task.reward(
            [[act[a] for act in actions] for a in range(task.num_agents)], item, item_index=index
        )

    where = f"item {index}"
    again = rec.attempt(f"{where}, scoring the same joint responses again", lambda: score(joint))
    if again is not None and not _close(again, group):
        rec.warnings.append(
            f"{where}: reward_func {task.reward.name} gave {again} on a second "
            f"call with the same completions, {group} on the first; runs will "
            "not be reproducible."
        )
    attempts = [
        rec.attempt(f"{where}, scoring joint response {j} alone", partial(score, [joint[j]]))
        for j in range(len(joint))
    ]
    alone = [a for a in attempts if a is not None]
    if len(alone) == len(attempts) and not _close([a[0] for a in alone], group):
        rec.warnings.append(
            f"{where}: reward_func {task.reward.name} scores joint responses differently alone "
            f"({[a[0] for a in alone]}) than together ({group}); the env scores one joint "
            "response per step while trainers score a group, so a reward should depend only on "
            "its own joint response."
        )
    if len(joint) > 1 and len(set(group)) == 1:
        rec.constant.setdefault(group[0], []).append(index)


def _warn_if_collapsed(
    task: Task, index: int, rewards: list[float], threshold: float | None, rec: _Recorder
) -> None:
    if task.num_turns > 1 and threshold is not None and all(r > threshold for r in rewards):
        rec.warn_once(
            "collapse",
            f"item {index}: every sample reward exceeds early_termination_threshold={threshold}, "
            f"so every branch would end after turn 1 of {task.num_turns}; pass "
            "early_termination_threshold=None to always play every turn, or a threshold only "
            "good answers reach (e.g. 0.9).",
        )


def _summary(rewards: list[float]) -> str:
    if len(rewards) <= 8:
        return "rewards " + ", ".join(f"{r:.4g}" for r in rewards)
    mean = sum(rewards) / len(rewards)
    return f"{len(rewards)} rewards from {min(rewards):.4g} to {max(rewards):.4g}, mean {mean:.4g}"


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a, b, strict=True)
    )
