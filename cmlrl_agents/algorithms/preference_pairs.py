"""Preference pairs over joint responses: the record, its sources and its JSON-lines file.

A :class:`PreferencePair` says that, for one task item, the joint response ``chosen`` (one text
per agent) is preferred to ``rejected``. Pairs come from one of four sources:

* the task reward: among the K joint candidates of an item, every ordered pair with a reward gap,
  selected by :func:`select_pairs` (``"reward_gap"``: largest gaps first, ``"all"``, ``"random"``);
* a ``preference_func(joint_a, joint_b, item) -> 1 | 0 | -1`` (1: a is preferred, -1: b, 0: tie);
* a comparator, the same call made by a judge (an LLM judge such as :class:`LLMJudge`, or a
  client of a remote model; its credentials stay inside it and are never written anywhere);
* a JSON-lines file of labelled pairs (human labels): :func:`save_pairs` / :func:`load_pairs`.

Pairs made from generated candidates keep their token ids (scored exactly as sampled); pairs
loaded from a file are re-tokenized from their texts.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.runs.redaction import REDACTED, is_secret_value
from cmlrl_env._errors import add_context

__all__ = [
    "PAIR_SELECTIONS",
    "PairLabeler",
    "PreferencePair",
    "load_pairs",
    "pairs_from_tree",
    "save_pairs",
    "select_pairs",
]

PAIR_SELECTIONS = ("reward_gap", "all", "random")
TokenRows = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class PreferencePair:
    """``chosen`` is preferred to ``rejected``; each holds one text per agent, in actor order."""

    prompts: tuple[str, ...]
    chosen: tuple[str, ...]
    rejected: tuple[str, ...]
    item: Mapping[str, Any] | None = None
    item_index: int | None = None
    chosen_reward: float | None = None
    rejected_reward: float | None = None
    source: str = "file"
    prompt_ids: TokenRows | None = None
    """Per agent, the prompt tokens the candidates were sampled from (None: re-tokenize)."""
    chosen_ids: TokenRows | None = None
    rejected_ids: TokenRows | None = None

    def __post_init__(self) -> None:
        n = len(self.prompts)
        if len(self.chosen) != n or len(self.rejected) != n:
            raise ValueError(
                f"a preference pair needs one prompt, one chosen and one rejected text per agent; "
                f"got {n} prompts, {len(self.chosen)} chosen, {len(self.rejected)} rejected."
            )


def select_pairs(
    rewards: Sequence[float], selection: str, max_pairs: int | None, rng: random.Random
) -> list[tuple[int, int]]:
    """``(winner, loser)`` index pairs among candidates with these rewards (ties never pair).

    ``reward_gap``: the ``max_pairs`` largest gaps (ties by index order); ``all``: every pair in
    index order (``max_pairs`` must be None); ``random``: ``max_pairs`` drawn with ``rng``.
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(
            f"pair_selection must be one of {list(PAIR_SELECTIONS)}, got {selection!r}."
        )
    pairs = [
        (i, j) for i, j in itertools.permutations(range(len(rewards)), 2) if rewards[i] > rewards[j]
    ]
    if selection == "reward_gap":
        pairs.sort(key=lambda p: -(rewards[p[0]] - rewards[p[1]]))  # stable: index order in ties
        return pairs if max_pairs is None else pairs[:max_pairs]
    if selection == "all" or max_pairs is None or len(pairs) <= max_pairs:
        return pairs
    return rng.sample(pairs, max_pairs)


def _check_label(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (-1, 0, 1):
        raise ValueError(
            f"{name} returned {value!r} for {where}; it must return 1 (the first joint response "
            "is preferred), -1 (the second is) or 0 (a tie, no pair)."
        )
    return int(value)


def _redacted(text: str) -> str:
    return REDACTED if is_secret_value(text) else text


@dataclass
class PairLabeler:
    """Turns one item's K joint candidates into ``(winner, loser)`` index pairs.

    ``judge`` None: by the task reward; otherwise ``judge(joint_a, joint_b, item)`` is called on
    every unordered candidate pair, and ``name`` ("preference_func" or "comparator") appears in
    its errors.
    """

    selection: str = "reward_gap"
    max_pairs: int | None = None
    judge: Callable[..., Any] | None = None
    name: str = "task reward"
    seed: int | None = None

    def __post_init__(self) -> None:
        self.start_round(0)
        if self.judge is not None and self.selection == "reward_gap":
            raise ValueError(
                f"pair_selection='reward_gap' ranks pairs by task reward, but the pairs come from "
                f"a {self.name}; use pair_selection='all' or 'random'."
            )

    def start_round(self, round_index: int) -> None:
        """A random stream per round, so a resumed run draws what an uninterrupted one did."""
        self.rng = random.Random(None if self.seed is None else f"{self.seed}:{round_index}")

    def label(
        self,
        joints: Sequence[tuple[str, ...]],
        rewards: Sequence[float],
        item: Mapping[str, Any],
        where: str,
    ) -> list[tuple[int, int]]:
        if self.judge is None:
            return select_pairs(rewards, self.selection, self.max_pairs, self.rng)
        pairs = []
        for i, j in itertools.combinations(range(len(joints)), 2):
            if joints[i] == joints[j]:
                continue  # identical texts: nothing to prefer
            label = _check_label(self._call(joints[i], joints[j], item, where), self.name, where)
            if label:
                pairs.append((i, j) if label > 0 else (j, i))
        if self.max_pairs is not None and len(pairs) > self.max_pairs:
            pairs = self.rng.sample(pairs, self.max_pairs)
        return pairs

    def _call(self, a: tuple[str, ...], b: tuple[str, ...], item: Any, where: str) -> Any:
        assert self.judge is not None
        try:
            return self.judge(list(a), list(b), item)
        except Exception as exc:
            # The judge's own exception, its type kept (``except`` clauses around train() still
            # catch it); its message may quote a request with its key, so what looks like one
            # is redacted, and a note says where it happened.
            exc.args = tuple(_redacted(a) if isinstance(a, str) else a for a in exc.args)
            add_context(
                exc,
                f"raised by the {self.name} while judging {where}. Fix the {self.name} (its "
                "model, endpoint or credentials), or label pairs another way (reward_func, "
                "preference_func or a pairs file).",
            )
            raise


def pairs_from_tree(tree: RolloutTree, labeler: PairLabeler) -> list[PreferencePair]:
    """The labelled pairs of a one-turn tree of K aligned candidates per item."""
    level = tree.levels[0]
    pairs = []
    for branch, slot in enumerate(level.item_slot):
        item, index = tree.items[slot]
        rows = [level.completions[a][branch] for a in range(tree.num_agents)]
        joints = [tuple(row[g].text for row in rows) for g in range(len(level.joints))]
        rewards = [o.reward for o in level.outcomes[branch]]
        where = f"item {index}" if index is not None else f"item at slot {slot}"
        prompt_ids = tuple(row[0].prompt_ids for row in rows)
        for w, lo in labeler.label(joints, rewards, item, where):
            pairs.append(
                PreferencePair(
                    prompts=tuple(level.states[branch].prompts),
                    chosen=joints[w],
                    rejected=joints[lo],
                    item=item,
                    item_index=index,
                    chosen_reward=rewards[w],
                    rejected_reward=rewards[lo],
                    source=labeler.name,
                    prompt_ids=prompt_ids,
                    chosen_ids=tuple(row[w].completion_ids for row in rows),
                    rejected_ids=tuple(row[lo].completion_ids for row in rows),
                )
            )
    return pairs


# -- JSON lines -----------------------------------------------------------------------------
_TEXT_FIELDS = ("prompts", "chosen", "rejected")
_OPTIONAL_FIELDS = ("item", "item_index", "chosen_reward", "rejected_reward", "source")
_ID_FIELDS = ("prompt_ids", "chosen_ids", "rejected_ids")
"""Optional token ids by agent name: a run's own pairs reload exactly as they were sampled."""


def _record(pair: PreferencePair, agent_names: Sequence[str]) -> dict[str, Any]:
    record: dict[str, Any] = {
        name: dict(zip(agent_names, getattr(pair, name), strict=True)) for name in _TEXT_FIELDS
    }
    for name in _OPTIONAL_FIELDS:
        value = getattr(pair, name)
        record[name] = dict(value) if name == "item" and value is not None else value
    for name in _ID_FIELDS:
        rows = getattr(pair, name)
        if rows is not None:
            record[name] = {a: list(r) for a, r in zip(agent_names, rows, strict=True)}
    return record


def save_pairs(
    path: str | Path, pairs: Sequence[PreferencePair], agent_names: Sequence[str]
) -> Path:
    """Write ``pairs`` as JSON lines (texts keyed by agent name), atomically."""
    path = Path(path)
    lines = []
    for k, pair in enumerate(pairs):
        if len(pair.prompts) != len(agent_names):
            raise ValueError(
                f"pairs[{k}] has {len(pair.prompts)} agents but agent_names has "
                f"{len(agent_names)}: {list(agent_names)}."
            )
        try:
            lines.append(json.dumps(_record(pair, agent_names), ensure_ascii=False))
        except TypeError as exc:
            raise TypeError(
                f"pairs[{k}] cannot be written as JSON ({exc}); its item must hold only JSON "
                "values (str, numbers, lists, dicts)."
            ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _texts(
    record: Mapping[str, Any], name: str, agent_names: Sequence[str], where: str
) -> tuple[str, ...]:
    value = record[name]
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{where}: {name!r} must be an object of texts by agent name, got {value!r}."
        )
    unknown = sorted(set(value) - set(agent_names))
    missing = [a for a in agent_names if a not in value]
    if unknown or missing:
        raise ValueError(
            f"{where}: {name!r} has unknown agents {unknown} and lacks {missing}; this team's "
            f"agents are {list(agent_names)} (one text each)."
        )
    for agent in agent_names:
        if not isinstance(value[agent], str):
            raise ValueError(f"{where}: {name}[{agent!r}] must be a string, got {value[agent]!r}.")
    return tuple(value[a] for a in agent_names)


def _pair_from_record(record: Any, agent_names: Sequence[str], where: str) -> PreferencePair:
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: each line must be a JSON object, got {record!r:.60}.")
    missing = [name for name in _TEXT_FIELDS if name not in record]
    if missing:
        raise ValueError(
            f"{where}: missing field(s) {missing}; each line needs 'prompts', 'chosen' and "
            "'rejected', each an object of texts by agent name."
        )
    unknown = sorted(set(record) - {*_TEXT_FIELDS, *_OPTIONAL_FIELDS, *_ID_FIELDS})
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {unknown}; allowed: "
            f"{[*_TEXT_FIELDS, *_OPTIONAL_FIELDS, *_ID_FIELDS]}."
        )
    # dict[str, Any]: each holds fields of different types, which ** cannot tell apart.
    texts: dict[str, Any] = {n: _texts(record, n, agent_names, where) for n in _TEXT_FIELDS}
    optional: dict[str, Any] = {
        n: record.get(n) for n in _OPTIONAL_FIELDS if record.get(n) is not None
    }
    ids: dict[str, Any] = {
        n: _ids(record, n, agent_names, where) for n in _ID_FIELDS if n in record
    }
    return PreferencePair(**texts, **optional, **ids)


def _ids(record: Mapping[str, Any], name: str, agent_names: Sequence[str], where: str) -> TokenRows:
    value = record[name]
    if not isinstance(value, Mapping) or sorted(value) != sorted(agent_names):
        raise ValueError(
            f"{where}: {name!r} must map each of {list(agent_names)} to a list of token ids, "
            f"got {str(value)[:60]}."
        )
    rows = tuple(value[a] for a in agent_names)
    if not all(isinstance(r, list) and all(type(t) is int for t in r) for r in rows):
        raise ValueError(f"{where}: {name!r} must hold lists of int token ids.")
    return tuple(tuple(r) for r in rows)


def load_pairs(path: str | Path, agent_names: Sequence[str]) -> list[PreferencePair]:
    """The pairs of a JSON-lines file written by :func:`save_pairs` (or by hand); blank lines
    are skipped. Errors name the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pairs file {path} does not exist; check pairs_file.")
    pairs = []
    # "\n" alone ends a line: JSON escapes it inside strings, but not U+2028, U+2029 or U+0085,
    # at which str.splitlines would also break.
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{where} is not JSON ({exc.msg}); write one object per line."
            ) from None
        pairs.append(_pair_from_record(record, agent_names, where))
    if not pairs:
        raise ValueError(f"pairs file {path} holds no pairs; write one JSON object per line.")
    return pairs
