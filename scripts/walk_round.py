"""A walk of one prompt through one MAGRPO round: the library files it passes and the calls
that cross from one file to another, read from a profile of the round as it runs.

The round is ``_train_round`` (collect -> batch -> update -> sync) of a MAGRPOTrainer on two
tiny offline agents, one length-ratio item, G = 2. Every call into a function of ``cmlrl_env``
or ``cmlrl_agents`` is recorded with the nearest library frame below it (so a model's
``forward`` reached through torch counts as called by the library function that called the
model). A call is *upward* when its caller's floor sits below the callee's in the order of
docs/design.md; it is *by import* when the caller's module holds a name from the callee's
module (the caller depends on the floor above it), else *by dispatch* (the higher object was
handed down: a hook the trainer overrides, a learner behind its protocol, a callback).

    python scripts/walk_round.py                 # 1 turn
    python scripts/walk_round.py --turns 2       # the task's feedback turn too, on every branch
    PYTHONPATH=<an older checkout> python scripts/walk_round.py   # the same walk of that code
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path
from typing import Any

# The floors of docs/design.md, lowest first; a module not named here is ranked by its package.
FLOORS = (
    "cmlrl_agents._checks",
    "cmlrl_agents.functional",
    "cmlrl_agents.policies",
    "cmlrl_env",
    "cmlrl_agents.foundation",
    "cmlrl_agents.learning",
    "cmlrl_agents.runs",
    "cmlrl_agents.algorithms",
    "cmlrl_agents.cli",
    "cmlrl_agents",
)


def floor_rank(module: str) -> int:
    return next(
        i for i, name in enumerate(FLOORS) if module == name or module.startswith(f"{name}.")
    )


def library_roots() -> dict[str, Path]:
    import cmlrl_agents
    import cmlrl_env

    return {p.__name__: Path(str(p.__file__)).parent.resolve() for p in (cmlrl_agents, cmlrl_env)}


def module_of(filename: str, roots: dict[str, Path]) -> str | None:
    path = Path(filename).resolve()
    for package, root in roots.items():
        if path.is_relative_to(root):
            parts = path.relative_to(root).with_suffix("").parts
            return ".".join((package, *parts)).removesuffix(".__init__")
    return None


def imports_from(caller: str, callee: str) -> bool:
    """Whether module ``caller`` holds, at its top level, ``callee`` or a name defined there."""
    namespace = vars(sys.modules[caller])
    for value in namespace.values():
        if isinstance(value, types.ModuleType):
            if value.__name__ == callee:
                return True
        elif getattr(value, "__module__", None) == callee:
            return True
    return False


class Walk:
    """The profile of one call of ``_train_round``: library calls, their callers, their files."""

    def __init__(self) -> None:
        self.roots = library_roots()
        self.modules: dict[str, str | None] = {}
        self.edges: Counter[tuple[str, str, str, str]] = Counter()
        self.functions: set[tuple[str, str]] = set()

    def _module(self, code: types.CodeType) -> str | None:
        if code.co_filename not in self.modules:
            self.modules[code.co_filename] = module_of(code.co_filename, self.roots)
        return self.modules[code.co_filename]

    def profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = self._module(frame.f_code)
        if callee is None:
            return
        name = frame.f_code.co_qualname
        self.functions.add((callee, name))
        caller_frame = frame.f_back
        while caller_frame is not None and self._module(caller_frame.f_code) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None:
            return
        caller = self._module(caller_frame.f_code)
        assert caller is not None
        if caller != callee:
            self.edges[(caller, caller_frame.f_code.co_qualname, callee, name)] += 1

    def files(self) -> list[str]:
        return sorted({module for module, _ in self.functions})

    def upward(self) -> list[tuple[str, str, str, str]]:
        """Calls whose caller's floor sits below the callee's."""
        return sorted(e for e in self.edges if floor_rank(e[0]) < floor_rank(e[2]))

    def report(self) -> str:
        files = self.files()
        upward = self.upward()
        by_import = [e for e in upward if imports_from(e[0], e[2])]
        lines = [
            f"files passed: {len(files)}",
            f"functions called: {len(self.functions)}",
            f"cross-file calls (distinct caller -> callee): {len(self.edges)}"
            f" ({sum(self.edges.values())} calls in all)",
            f"upward calls: {len(upward)}, of them by import: {len(by_import)}",
            "",
            "files:",
            *(f"  {module}" for module in files),
            "",
            "upward calls (caller -> callee):",
            *(
                f"  {'import  ' if e in by_import else 'dispatch'} {e[0]}:{e[1]} -> {e[2]}:{e[3]}"
                for e in sorted(upward)
            ),
        ]
        return "\n".join(lines)


def build_trainer(turns: int, output_dir: str) -> Any:
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    from cmlrl_agents.tiny_models import tiny_agent
    from cmlrl_env import tasks

    train, _ = tasks.length_ratio_splits()
    args = MAGRPOConfig(
        num_agents=2,
        num_turns=turns,
        num_generations=2,
        rollout_buffer_size=1,
        max_new_tokens=6,
        eval_interval=0,
        logging_steps=1,
        output_dir=output_dir,
        seed=0,
        # Every branch plays every turn: at the default threshold the tiny agents' first
        # answers would end each branch after turn 1, and the walk would not reach turn 2.
        early_termination_threshold=None if turns > 1 else -0.2,
    )
    return MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=train.select([0]),
        args=args,
        external_transition=tasks.length_feedback if turns > 1 else None,
    )


def walk_round(turns: int) -> Walk:
    """Train one round of ``turns`` turns, profiling its ``_train_round``."""
    walk = Walk()
    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(turns, str(Path(folder) / "run"))
        train_round = trainer._train_round

        def walked_round(items: Any) -> Any:
            sys.setprofile(walk.profile)
            try:
                return train_round(items)
            finally:
                sys.setprofile(None)

        trainer._train_round = walked_round
        trainer.train()
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    walk = walk_round(args.turns)
    print(f"one MAGRPO round, {args.turns} turn(s), 2 tiny agents, 1 item, G = 2")
    print(walk.report())


if __name__ == "__main__":
    main()
