"""Writing collaboration (the MAGRPO paper's TLDR-style task) on real news or our own passages.

Agent 0 writes a concise summary of a passage; agent 1 writes a longer expansion with a richer
vocabulary. ``writing_reward`` scores the pair in gated levels (a gate that fails stops there):

=====  ==============================================================  ======
level  what                                                            reward
=====  ==============================================================  ======
1      summary 8–80 words and expansion 16–300 words (gate)              0.5
2      length ratio r = chars(expansion) / chars(summary): 1 on          1.0 × s
       [1.6, 3.2], rising linearly from 0 at 1.1, falling to 0 at 5.0
       (gate: s > 0)
3      unique-word ratio u = distinct words of the expansion over        0.5 × v
       those of the summary: v = 1 at u >= 2.0, linear from 0 at 1.3
4      transition-word style: categories of transition words used in     1.0 × t
       the expansion (of ``TRANSITION_WORDS``), t = min(categories, 3)/3
=====  ==============================================================  ======

The maximum is ``WRITING_REWARD_MAX = 3.0``. Words are lower-cased runs of letters, digits
and apostrophes.

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

WRITING_REWARD_MAX = 3.0
SUMMARY_WORDS = (8, 80)
EXPANSION_WORDS = (16, 300)
_WORD = re.compile(r"[a-z0-9']+")

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
# A sentence ends at . ! or ? (and a closing quote) before a space and a capital, digit or
# quote; not after a title such as "Mr." or "Dr.".
_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?][\"'])|(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bNo\.)"
    r"(?<=[.!?]))\s+(?=[\"'A-Z0-9])"
)

TRANSITION_WORDS: dict[str, tuple[str, ...]] = {
    "addition": ("moreover", "furthermore", "additionally", "also", "in addition"),
    "contrast": ("however", "although", "nevertheless", "on the other hand", "whereas", "yet"),
    "cause": ("because", "therefore", "consequently", "as a result", "thus", "since"),
    "example": ("for example", "for instance", "such as", "in particular"),
    "sequence": ("first", "then", "finally", "afterwards", "meanwhile", "next"),
    "conclusion": ("in conclusion", "overall", "in short", "ultimately", "in summary"),
}


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


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _ramp(x: float, zero: float, one: float) -> float:
    """0 at ``zero``, 1 at ``one``, linear between, clipped (either direction)."""
    return min(max((x - zero) / (one - zero), 0.0), 1.0)


def _transition_categories(text: str) -> int:
    padded = " " + " ".join(_words(text)) + " "
    return sum(
        any(f" {phrase} " in padded for phrase in phrases) for phrases in TRANSITION_WORDS.values()
    )


def writing_levels(summary: str, expansion: str) -> dict[str, float]:
    """The levels of one (summary, expansion) pair; their sum is the reward."""
    s_words, e_words = _words(summary), _words(expansion)
    if not (
        SUMMARY_WORDS[0] <= len(s_words) <= SUMMARY_WORDS[1]
        and EXPANSION_WORDS[0] <= len(e_words) <= EXPANSION_WORDS[1]
    ):
        return {"length_bounds": 0.0}
    levels = {"length_bounds": 0.5}
    ratio = len(expansion.strip()) / max(len(summary.strip()), 1)
    score = _ramp(ratio, 1.1, 1.6) if ratio < 1.6 else _ramp(ratio, 5.0, 3.2)
    levels["length_ratio"] = 1.0 * score
    if score <= 0.0:
        return levels
    unique = len(set(e_words)) / max(len(set(s_words)), 1)
    levels["vocabulary"] = 0.5 * _ramp(unique, 1.3, 2.0)
    levels["transitions"] = 1.0 * min(_transition_categories(expansion), 3) / 3
    return levels


def writing_reward(summaries: Sequence[str], expansions: Sequence[str]) -> list[float]:
    """The gated writing reward (max ``WRITING_REWARD_MAX = 3.0``) of each pair."""
    return [
        float(sum(writing_levels(s, e).values()))
        for s, e in zip(summaries, expansions, strict=True)
    ]


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
    line) and the rest; the expansion is ``""`` when there is one paragraph only."""
    first, _, rest = text.strip().partition("\n\n")
    return first.strip(), rest.strip()


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
    """One row per evaluated item, per turn: ``turn_k/reward`` and one ``turn_k/level/<name>``
    per level, from two agents (summary, expansion) or one (``split_single_text``)."""
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
            for name in ("length_bounds", "length_ratio", "vocabulary", "transitions"):
                row[f"turn_{turn + 1}/level/{name}"] = levels.get(name, 0.0)
        rows.append(row)
    return rows


def writing_eval_aggregator(
    rows: Sequence[Mapping[str, float]], *, num_turns: int
) -> dict[str, float]:
    """Means over the rows of each value (the code aggregator's, whose only renaming, of pass
    flags, does not apply to writing rows)."""
    from cmlrl_env.code_metrics import code_eval_aggregator

    return code_eval_aggregator(rows, num_turns=num_turns)
