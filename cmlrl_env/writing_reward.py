"""The MAGRPO paper's writing reward (its TLDR reward), and content measures it does not train on.

Agent 0 writes a short text (the summary), agent 1 a longer one (the expansion).
``writing_levels`` grades a pair in gated levels, as ``tldr_combined_reward`` in the paper's
published code (OpenMLRL ``LLM_Collab_Writing``, ``rewards/tldr_rewards.py``) computes them; a
gate that fails stops there:

=====  ==================================================================  ============
level  what                                                                reward
=====  ==================================================================  ============
1      both texts have 8–256 whitespace-separated tokens (gate)              0.5
2      character ratio r = len(expansion) / len(summary): 1 on [1.6, 3.2],   1.0 × s
       (r − 1.1) / 0.5 on [1.1, 1.6), 1 − (r − 3.2) / 1.8 on (3.2, 5.0];
       outside [1.1, 5.0] the reward stops
3      distinct words u = expansion's / summary's (stopwords kept): 0.5 at   0.5 × v
       u >= 2.0, (u − 1.3) / 0.7 × 0.5 on [1.3, 2.0); below 1.3 it stops
4a     transitions: n of the 12 categories of ``TRANSITION_WORDS`` with a    0.4 × t
       phrase inside the lower-cased expansion; t = 0 for n = 0, else
       min(0.4 + 0.05 × (n − 1), 1.0)
4b     overlap: Jaccard similarity of the two texts' word sets without       0.6 × j
       ``STOPWORDS``; j = min(J, 0.03) / 0.03
=====  ==================================================================  ============

Words are ``\\b\\w+\\b`` of the lower-cased text. ``WRITING_REWARD_MAX = 3.0`` is the paper's
stated maximum; t reaches at most 0.95 (12 categories), so no pair scores above 2.98.
Differences from the paper's code: none in the arithmetic; the token bounds are a parameter
(``token_bounds``, the paper's 8–256 by default); see docs/tasks.md.

``content_measures`` says how much of the passage the texts carry (the share of each text's
content words found in the passage, and the longest run of words copied from it): the reward
never sees the passage, so these tell learning the task from learning the reward's format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = [
    "CONTENT_MEASURES",
    "STOPWORDS",
    "TOKEN_BOUNDS",
    "TRANSITION_WORDS",
    "WRITING_LEVELS",
    "WRITING_REWARD_MAX",
    "content_measures",
    "writing_levels",
    "writing_reward",
]

WRITING_REWARD_MAX = 3.0
TOKEN_BOUNDS = (8, 256)
"""Whitespace tokens each text must have (both ends included): the paper's 8–256."""
WRITING_LEVELS = ("length_bounds", "length_ratio", "vocabulary", "transitions", "overlap")
CONTENT_MEASURES = (
    "summary_in_passage",
    "expansion_in_passage",
    "summary_longest_copy",
    "expansion_longest_copy",
)
OVERLAP_FULL = 0.03
"""The Jaccard similarity at which the overlap level is full (the paper's cap)."""
_WORD = re.compile(r"\b\w+\b")


def _phrases(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(","))


# The paper's lists, in its order (its file writes them as Python lists of strings).
TRANSITION_WORDS: dict[str, tuple[str, ...]] = {
    "elaboration": _phrases(
        "furthermore, moreover, additionally, also, besides, in addition, what is more, "
        "not only, as well as, along with, coupled with, together with, likewise, similarly, "
        "equally important, by the same token, in the same way, correspondingly, "
        "in like manner, comparatively, analogously"
    ),
    "examples": _phrases(
        "for example, for instance, specifically, particularly, namely, such as, including, "
        "especially, in particular, to illustrate, as an illustration, case in point, "
        "to demonstrate, as evidence, to exemplify, notably, markedly, chiefly, mainly, "
        "primarily, above all, most importantly"
    ),
    "explanation": _phrases(
        "that is, in other words, to put it simply, to clarify, indeed, in fact, actually, "
        "clearly, obviously, to put it another way, to rephrase, more precisely, "
        "specifically speaking, what this means is, the point is, essentially, basically, "
        "fundamentally, at its core, in essence, simply put, stated differently"
    ),
    "cause_effect": _phrases(
        "therefore, thus, consequently, as a result, hence, accordingly, for this reason, "
        "due to this, because of this, so, then, thereby, wherefore, thence, ergo, "
        "as a consequence, in consequence, it follows that, this leads to, this results in, "
        "this causes, this brings about, owing to, on account of, thanks to, resulting from"
    ),
    "contrast": _phrases(
        "however, nevertheless, nonetheless, on the other hand, in contrast, while, whereas, "
        "although, even though, despite this, but, yet, still, conversely, on the contrary, "
        "rather, instead, alternatively, otherwise, in opposition, by contrast, contrarily, "
        "notwithstanding, regardless, all the same, even so, be that as it may, in any case, "
        "at any rate"
    ),
    "sequence": _phrases(
        "first, second, third, next, then, after that, finally, lastly, initially, "
        "subsequently, meanwhile, to begin with, to start with, in the beginning, at first, "
        "at the outset, primarily, secondly, thirdly, following this, afterward, later, "
        "later on, in the meantime, simultaneously, concurrently, at the same time, "
        "in conclusion, to conclude, ultimately, in the end, to summarize, in summary"
    ),
    "emphasis": _phrases(
        "indeed, certainly, surely, undoubtedly, without doubt, definitely, absolutely, "
        "positively, unquestionably, indubitably, of course, naturally, obviously, clearly, "
        "evidently, manifestly, undeniably, admittedly, granted, to be sure, in fact, "
        "as a matter of fact, notably, significantly"
    ),
    "summary": _phrases(
        "in summary, in conclusion, to summarize, to conclude, in short, in brief, briefly, "
        "to sum up, on the whole, overall, all in all, in essence, essentially, basically, "
        "fundamentally, in the final analysis, after all, ultimately, in the end, "
        "when all is said and done, the bottom line is"
    ),
    "comparison": _phrases(
        "similarly, likewise, in the same way, equally, just as, comparable to, in comparison, "
        "by the same token, correspondingly, in like manner, along the same lines, "
        "in similar fashion, analogously, by analogy, just like, much like, as with"
    ),
    "concession": _phrases(
        "although, though, even though, while, whereas, despite, in spite of, regardless of, "
        "notwithstanding, admittedly, granted, even if, be that as it may, nevertheless, "
        "nonetheless, however, yet, still, all the same"
    ),
    "condition": _phrases(
        "if, unless, provided that, assuming that, supposing that, in case, in the event that, "
        "on condition that, given that, as long as, so long as, only if, even if, "
        "whether or not, should, were, had, otherwise, or else"
    ),
    "time": _phrases(
        "when, while, as, after, before, until, since, during, meanwhile, simultaneously, "
        "at the same time, concurrently, previously, formerly, earlier, later, afterward, "
        "subsequently, eventually, finally, recently, lately, nowadays, currently, presently, "
        "immediately"
    ),
}
"""The paper's 12 categories of transition phrases. A phrase counts when it occurs anywhere in
the lower-cased expansion, inside a longer word too (the paper's substring test: "as" is found
in "was", so almost every text has the time category)."""

STOPWORDS = frozenset(
    """a all also an and any are as at bad be been being both but by can could did do does each
    few first for from good great had has have he her here him his how i if in is it its just
    last left little long low many may me might more most much must my new no not now of old on
    only or other our own right same shall should so some such than that the their them then
    there these they this those to too us very was we were what when where which who why will
    with would you your""".split()
)
"""The paper's stopwords (106 words), left out of the overlap level's word sets."""


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _transition_scale(expansion: str) -> float:
    lowered = expansion.lower()
    found = sum(any(p in lowered for p in phrases) for phrases in TRANSITION_WORDS.values())
    return 0.0 if found == 0 else min(0.4 + 0.05 * (found - 1), 1.0)


def _overlap(summary: str, expansion: str) -> float:
    """The Jaccard similarity of the two texts' word sets without stopwords (1.0 when both are
    empty, as in the paper)."""
    first, second = (set(_words(t)) - STOPWORDS for t in (summary, expansion))
    if not first and not second:
        return 1.0
    return len(first & second) / len(first | second)


def _length_ratio_score(ratio: float) -> float | None:
    """Level 2's share, or None outside [1.1, 5.0] (the reward stops)."""
    if 1.6 <= ratio <= 3.2:
        return 1.0
    if 1.1 <= ratio < 1.6:
        return (ratio - 1.1) / 0.5
    if 3.2 < ratio <= 5.0:
        return 1.0 - (ratio - 3.2) / 1.8
    return None


def writing_levels(
    summary: str, expansion: str, *, token_bounds: tuple[int, int] = TOKEN_BOUNDS
) -> dict[str, float]:
    """The levels of one (summary, expansion) pair; their sum is the reward. A level that stops
    the reward is in the result with 0.0; the levels after it are not."""
    low, high = token_bounds
    if not all(low <= len(text.split()) <= high for text in (summary, expansion)):
        return {"length_bounds": 0.0}
    levels = {"length_bounds": 0.5}
    ratio = _length_ratio_score(len(expansion) / len(summary))
    levels["length_ratio"] = ratio or 0.0
    if ratio is None:
        return levels
    summary_distinct = len(set(_words(summary)))
    distinct = len(set(_words(expansion))) / summary_distinct if summary_distinct else 0.0
    if distinct < 1.3:
        levels["vocabulary"] = 0.0
        return levels
    levels["vocabulary"] = 0.5 if distinct >= 2.0 else (distinct - 1.3) / 0.7 * 0.5
    levels["transitions"] = 0.4 * _transition_scale(expansion)
    levels["overlap"] = 0.6 * min(_overlap(summary, expansion), OVERLAP_FULL) / OVERLAP_FULL
    return levels


def writing_reward(
    summaries: Sequence[str],
    expansions: Sequence[str],
    *,
    token_bounds: tuple[int, int] = TOKEN_BOUNDS,
) -> list[float]:
    """The gated writing reward of each pair (see the module docstring; at most 2.98 of
    ``WRITING_REWARD_MAX = 3.0``)."""
    if not (
        len(token_bounds) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) for b in token_bounds)
        and 1 <= token_bounds[0] <= token_bounds[1]
    ):
        raise ValueError(
            f"writing_reward: token_bounds must be (low, high) ints with 1 <= low <= high, got "
            f"{token_bounds!r}; the paper's are {TOKEN_BOUNDS}."
        )
    return [
        float(sum(writing_levels(s, e, token_bounds=token_bounds).values()))
        for s, e in zip(summaries, expansions, strict=True)
    ]


# -- what the reward does not see: the passage ---------------------------------------------------


def _longest_copy(words: Sequence[str], passage: Sequence[str]) -> int:
    """The most consecutive words of ``words`` that also occur consecutively in ``passage``."""
    best = 0
    previous = [0] * (len(passage) + 1)
    for word in words:
        current = [0] * (len(passage) + 1)
        for j, other in enumerate(passage):
            if word == other:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def content_measures(summary: str, expansion: str, passage: str) -> dict[str, float]:
    """How much of the passage each text carries: ``<text>_in_passage``, the share of its
    distinct content words (not in ``STOPWORDS``) that occur in the passage (0.0 for a text
    with none), and ``<text>_longest_copy``, the longest run of its words copied from the
    passage, in words."""
    source = _words(passage)
    source_set = set(source)
    out: dict[str, float] = {}
    for name, text in (("summary", summary), ("expansion", expansion)):
        words = _words(text)
        content = set(words) - STOPWORDS
        out[f"{name}_in_passage"] = len(content & source_set) / len(content) if content else 0.0
        out[f"{name}_longest_copy"] = float(_longest_copy(words, source))
    return out


def content_row(pair: tuple[str, str], item: Mapping[str, object], prefix: str) -> dict[str, float]:
    """``content_measures`` of a pair against the item's passage (its ``prompt``), keys
    prefixed ``<prefix>/content/``; empty when the item has no passage."""
    passage = item.get("prompt")
    if not isinstance(passage, str):
        return {}
    return {f"{prefix}/content/{k}": v for k, v in content_measures(*pair, passage).items()}
