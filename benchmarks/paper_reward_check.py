"""Our writing reward against the paper's own function, on random pairs of texts.

The paper's reward is ``tldr_combined_reward`` in ``rewards/tldr_rewards.py`` of the MAGRPO
authors' repository (OpenMLRL ``LLM_Collab_Writing``); download that file and pass its path.
Pairs are drawn from the news passages' words, the transition phrases and the stopwords, with
lengths that reach every level; the script prints how many pairs disagree (by more than 1e-12)
and the spread of the paper's rewards:

    python benchmarks/paper_reward_check.py --paper-file tldr_rewards.py --pairs 20000
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import re
from collections.abc import Sequence

from cmlrl_env.writing_reward import STOPWORDS, TRANSITION_WORDS, writing_reward
from cmlrl_env.writing_tasks import writing_news_splits


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paper-file", required=True, help="the paper's tldr_rewards.py")
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def random_pairs(count: int, seed: int) -> tuple[list[str], list[str]]:
    train, evaluation = writing_news_splits()
    passages = list(train["prompt"]) + list(evaluation["prompt"])
    vocabulary = sorted({w for p in passages for w in re.findall(r"\w+", p)})
    vocabulary += [p for phrases in TRANSITION_WORDS.values() for p in phrases]
    vocabulary += sorted(STOPWORDS)
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(vocabulary) for _ in range(words)) + rng.choice(
            ["", ".", " ", "\n"]
        )

    summaries, expansions = [], []
    for _ in range(count):
        words = rng.randint(1, 60)
        summary, expansion = text(words), text(rng.randint(1, 300))
        if rng.random() < 0.3:  # shared words: the overlap level
            expansion = f"{summary} {text(rng.randint(1, 40))}"
        if rng.random() < 0.1:  # near the ratio bounds
            expansion = text(words * rng.randint(1, 4))
        summaries.append(summary)
        expansions.append(expansion)
    return summaries, expansions


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    spec = importlib.util.spec_from_file_location("paper_tldr_rewards", args.paper_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--paper-file {args.paper_file!r} is not a Python file")
    paper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paper)
    paper.VERBOSE = False  # its reward prints every level otherwise
    summaries, expansions = random_pairs(args.pairs, args.seed)
    ours = writing_reward(summaries, expansions)
    theirs = paper.tldr_combined_reward(summaries, expansions)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if abs(a - b) > 1e-12]
    print(f"{len(differ)} of {args.pairs} pairs differ (seed {args.seed})")
    for i in differ[:5]:
        pair = f"{summaries[i]!r} / {expansions[i]!r}"
        print(f"  {ours[i]:.6f} ours, {theirs[i]:.6f} the paper's: {pair}")
    spread = collections.Counter(round(r, 1) for r in theirs)
    print("the paper's rewards, rounded:", dict(sorted(spread.items())))


if __name__ == "__main__":
    main()
