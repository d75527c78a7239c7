"""The walk of one MAGRPO round (``scripts/walk_round.py``) follows the data flow of
docs/design.md through the code as it runs, and no call in it goes up a floor by import."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from walk_round import floor_rank, imports_from, walk_round  # noqa: E402


def test_floors_rank_as_docs_design_lists_them() -> None:
    ranks = [
        floor_rank(m)
        for m in (
            "cmlrl_agents.functional.advantages",
            "cmlrl_agents.policies.generation",
            "cmlrl_env.env",
            "cmlrl_agents.foundation.rollout",
            "cmlrl_agents.learning.engine",
            "cmlrl_agents.runs.round_trainer",
            "cmlrl_agents.algorithms.magrpo",
        )
    ]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert floor_rank("cmlrl_agents.tiny_models") > floor_rank("cmlrl_agents.cli.spec")


def test_imports_from_reads_the_callers_names() -> None:
    import cmlrl_agents.learning.engine  # noqa: F401

    assert imports_from("cmlrl_agents.learning.engine", "cmlrl_agents.foundation.distributed")
    assert not imports_from("cmlrl_agents.learning.engine", "cmlrl_agents.algorithms.magrpo")


def test_a_two_turn_round_passes_each_arrow_and_goes_up_only_by_dispatch() -> None:
    walk = walk_round(turns=2)
    files = walk.files()
    for stage in (
        "cmlrl_env.formatters",  # item -> prompt
        "cmlrl_agents.policies.generation",  # prompt -> completion
        "cmlrl_env.env",  # completion -> env.step -> reward, transition
        "cmlrl_agents.learning.credit",  # returns -> advantages
        "cmlrl_agents.learning.engine",  # the optimizer step
    ):
        assert stage in files
    upward = walk.upward()
    # The loop calls up only into what the trainer subclass and its learner hand it.
    assert upward and all(caller.startswith("cmlrl_agents.runs.") for caller, *_ in upward)
    assert not [e for e in upward if imports_from(e[0], e[2])]
