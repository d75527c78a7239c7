"""Writing collaboration (the MAGRPO paper's TLDR-style task) on real news or our own passages.

Agent 0 writes a concise summary of a passage; agent 1 writes a longer expansion with a richer
vocabulary. ``writing_reward`` (``cmlrl_env.writing_reward``) scores the pair as the MAGRPO
paper's TLDR reward does (max ``WRITING_REWARD_MAX = 3.0``); the evaluation hooks report its
levels and, beside them, how much of the passage the texts carry (``content_measures``), which
the reward never sees.

Passages: ``writing_news_splits`` reads real news (the Lee corpus of Australian Broadcasting
Corporation news articles, 300 + 50, as shipped in the test data of the PyPI package ``gensim``
4.4.0, LGPL-2.1; the files are read from disk, nothing of the package is imported);
``writing_splits`` has 12 short passages written for this project. Any dataset with a
``prompt`` column of passages (e.g. a TL;DR or abstracts dataset from the Hugging Face hub)
works with the same formatters and reward.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

from cmlrl_env.writing_reward import (
    TRANSITION_WORDS,
    WRITING_LEVELS,
    WRITING_REWARD_MAX,
    content_row,
    writing_levels,
    writing_reward,
)

__all__ = [
    "NEWS_FILES",
    "TRANSITION_WORDS",
    "WRITING_PASSAGES",
    "WRITING_REWARD_MAX",
    "expansion_formatter",
    "news_passages",
    "single_writing_formatter",
    "split_single_text",
    "summary_formatter",
    "writing_dataset",
    "writing_eval_aggregator",
    "writing_eval_logger",
    "writing_levels",
    "writing_news_splits",
    "writing_reward",
    "writing_single_reward",
    "writing_splits",
]


# Short passages written for this project (no licence attached beyond the project's).
WRITING_PASSAGES = (
    "The town library started lending tools last spring. Residents can now borrow drills, "
    "ladders and sewing machines with the same card they use for books.",
    "A small bakery switched to a four-day week. The owner says sales stayed the same because "
    "customers simply moved their visits, and the staff took fewer sick days.",
    "Researchers tracked city foxes with light collars for a year. The foxes crossed busy roads "
    "mostly after midnight and slept in gardens during the day.",
    "A school replaced its bells with soft music between lessons. Teachers report calmer "
    "hallways, though some students miss the old ring.",
    "Volunteers planted two hundred trees along a river bank. Within three years the bank "
    "stopped eroding and kingfishers returned to nest.",
    "An office let employees choose their own desks each morning. Teams that sat together "
    "finished projects faster, but quiet workers asked for a silent room.",
    "A village installed solar panels on the roof of its sports hall. The hall now pays for its "
    "lights and sells extra power to the grid in summer.",
    "A museum opened on Monday evenings for people who work during the day. Attendance doubled "
    "and the café stayed open late to serve visitors.",
    "A family kept a diary of every item they threw away for a month. They found that food "
    "packaging made up half of their rubbish.",
    "A bus company added bicycle racks to its rural routes. Cyclists now ride to the bus stop "
    "and finish long trips by bus when the weather turns.",
    "A hospital garden was opened to patients and their families. Nurses noticed that patients "
    "who spent time outside asked for less pain medicine.",
    "A chess club began meeting in a laundromat while people waited for their washing. Several "
    "customers joined, and the owner bought new boards.",
)
WRITING_EVAL_SIZE = 3
NEWS_FILES = ("lee_background.cor", "lee.cor")
"""The Lee corpus files in gensim's test data: 300 articles (train) and 50 others (eval)."""
NEWS_SENTENCES = 2
_BLANK_LINE = re.compile(r"\r?\n[ \t]*\r?\n")
# A sentence ends at . ! or ? (and a closing quote) before a space and a capital, digit or
# quote; not after a title such as "Mr." or "Dr.".
_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?][\"'])|(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bNo\.)"
    r"(?<=[.!?]))\s+(?=[\"'A-Z0-9])"
)


def writing_dataset() -> Dataset:
    """The 12 passages as ``prompt`` items."""
    return Dataset.from_dict({"prompt": list(WRITING_PASSAGES)})


def writing_splits() -> tuple[Dataset, Dataset]:
    """(train, eval): the first 9 passages and the last 3, always the same."""
    data = writing_dataset()
    n = len(data)
    return data.select(range(n - WRITING_EVAL_SIZE)), data.select(range(n - WRITING_EVAL_SIZE, n))


def _news_file(name: str) -> str:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the news passages are read from the test data shipped in the PyPI package gensim; "
            "install it with: pip install 'gensim==4.4.0' (or pip install 'cmlrl[corpus]')"
        )
    folder = next(iter(spec.submodule_search_locations))
    path = f"{folder}/test/test_data/{name}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} is missing; reinstall: pip install 'gensim==4.4.0'."
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # lee.cor is Windows-1252 (a pound sign, curly quotes)
        return raw.decode("cp1252")


@functools.lru_cache(maxsize=2)
def news_passages(name: str) -> tuple[str, ...]:
    """The passages of one Lee corpus file (``NEWS_FILES``): each article's first two
    sentences (the news lead), in file order; no article is left out."""
    if name not in NEWS_FILES:
        raise ValueError(f"news_passages: name must be one of {NEWS_FILES}, got {name!r}.")
    articles = [line.strip() for line in _news_file(name).splitlines() if line.strip()]
    return tuple(" ".join(_SENTENCE_END.split(text)[:NEWS_SENTENCES]) for text in articles)


def writing_news_splits() -> tuple[Dataset, Dataset]:
    """(train, eval) of real news passages as ``prompt`` items: the 300 articles of
    ``lee_background.cor`` and the 50 of ``lee.cor``, always the same (see ``news_passages``)."""
    train, test = (Dataset.from_dict({"prompt": list(news_passages(n))}) for n in NEWS_FILES)
    return train, test


def summary_formatter(item: Mapping[str, Any]) -> str:
    return (
        "Write a concise summary (one or two sentences) of this passage. Reply with the "
        f"summary only.\n\n{item['prompt']}"
    )


def expansion_formatter(item: Mapping[str, Any]) -> str:
    return (
        "Expand this passage into a longer paragraph with more detail and varied vocabulary, "
        "using linking words such as 'however', 'for example' or 'as a result'. Reply with the "
        f"paragraph only.\n\n{item['prompt']}"
    )


# -- one model writes both texts ----------------------------------------------------------------


def single_writing_formatter(item: Mapping[str, Any]) -> str:
    """One agent writes both texts: the summary as its first paragraph, then the expansion."""
    return (
        "Write two paragraphs about this passage, separated by a blank line. First, a concise "
        "summary (one or two sentences). Second, a longer paragraph that expands the passage "
        "with more detail and varied vocabulary, using linking words such as 'however', 'for "
        f"example' or 'as a result'. Reply with the two paragraphs only.\n\n{item['prompt']}"
    )


def split_single_text(text: str) -> tuple[str, str]:
    """(summary, expansion) of one agent's text: its first paragraph (up to the first blank
    line, which may hold spaces or end in ``\r\n``) and the rest; the expansion is ``""`` when
    there is one paragraph only."""
    first, *rest = _BLANK_LINE.split(text.strip(), maxsplit=1)
    return first.strip(), rest[0].strip() if rest else ""


def writing_single_reward(completions: Sequence[str]) -> list[float]:
    """``writing_reward`` of each text split by ``split_single_text``."""
    parts = [split_single_text(c) for c in completions]
    return writing_reward([s for s, _ in parts], [e for _, e in parts])


# -- evaluation hooks ---------------------------------------------------------------------------


def writing_eval_logger(
    *,
    agent_completions_turns: Sequence[Sequence[Sequence[str]]],
    batch_items: Sequence[Mapping[str, Any]],
    prompts: Sequence[Any] | None = None,
) -> list[dict[str, float]]:
    """One row per evaluated item, per turn: ``turn_k/reward``, one ``turn_k/level/<name>`` per
    level and one ``turn_k/content/<name>`` per content measure (against the item's ``prompt``,
    the passage), from two agents (summary, expansion) or one (``split_single_text``)."""
    agents = len(agent_completions_turns)
    if agents not in (1, 2):
        raise ValueError(f"writing_eval_logger scores 1 or 2 agents, got {agents}.")
    rows: list[dict[str, float]] = []
    for i in range(len(batch_items)):
        row: dict[str, float] = {}
        chains = [agent_completions_turns[a][i] for a in range(agents)]
        for turn in range(min(len(c) for c in chains)):
            pair = (
                split_single_text(chains[0][turn])
                if agents == 1
                else (chains[0][turn], chains[1][turn])
            )
            levels = writing_levels(*pair)
            row[f"turn_{turn + 1}/reward"] = float(sum(levels.values()))
            for name in WRITING_LEVELS:
                row[f"turn_{turn + 1}/level/{name}"] = levels.get(name, 0.0)
            row.update(content_row(pair, batch_items[i], f"turn_{turn + 1}"))
        rows.append(row)
    return rows


def writing_eval_aggregator(
    rows: Sequence[Mapping[str, float]], *, num_turns: int
) -> dict[str, float]:
    """Means over the rows of each value (the code aggregator's, whose only renaming, of pass
    flags, does not apply to writing rows)."""
    from cmlrl_env.code_metrics import code_eval_aggregator

    return code_eval_aggregator(rows, num_turns=num_turns)
