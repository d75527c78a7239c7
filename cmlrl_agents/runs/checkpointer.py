"""A run folder's checkpoints, as the trainer's collaborator: save, find, resume, replace.

The trainer hands the :class:`Checkpointer` what a checkpoint holds (its learner's models and
optimizers, its state as plain data); the checkpointer owns the folder rules (one run per
folder, the run's identity checked before any weight is loaded: :mod:`run_dirs`), who writes
under a data parallel launch (rank 0, with every rank's RNG state gathered to it) and the files
(:mod:`checkpoint`). ``save_models`` writes the ``from_pretrained`` folders of ``save_model``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cmlrl_agents.foundation.distributed import DataParallel
from cmlrl_agents.learning.learner import Learner
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.runs.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
)
from cmlrl_agents.runs.run_dirs import clear_checkpoints, foreign_checkpoints

__all__ = ["Checkpointer", "save_models"]


class Checkpointer:
    """``run_dir/checkpoints/checkpoint-<items seen>`` (and ``run_dir/best/`` for the best
    model by an evaluation metric) of one run."""

    def __init__(self, run_dir: Path, parallel: DataParallel) -> None:
        self.run_dir = run_dir
        self.parallel = parallel

    @property
    def root(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def best_root(self) -> Path:
        return self.run_dir / "best"

    def start_fresh(self, run_id: str, overwrite: bool) -> None:
        """Refuse (or, with ``overwrite``, delete) another run's checkpoints in the folder."""
        foreign = foreign_checkpoints(self.root, run_id)
        if foreign and not overwrite:
            names = ", ".join(p.name for p in foreign)
            raise FileExistsError(
                f"{self.run_dir} holds checkpoints of another run ({names}); a fresh run "
                "there would mix with it. Resume it with "
                "train(resume_from_checkpoint='latest'), set args.overwrite_output_dir=True to "
                "replace it (its checkpoints are deleted), or choose another output_dir."
            )
        if self.parallel.is_main:
            clear_checkpoints(foreign)
            if overwrite and self.best_root.exists():
                shutil.rmtree(self.best_root)
        self.parallel.barrier()  # no rank starts while rank 0 is still deleting

    def save(
        self,
        name: int,
        learner: Learner[Any],
        state: dict[str, Any],
        *,
        keep_last: int | None,
        weights_only: bool = False,
        best: bool = False,
    ) -> Path:
        """Write checkpoint ``name`` (the items seen) of the learner's parts and ``state``;
        every rank calls it (their RNG states are gathered), rank 0 writes, all wait for it."""
        models, optimizers = learner.checkpoint_parts()
        rngs = self.parallel.gather(rng_state())
        root = self.best_root if best else self.root
        path = root / f"checkpoint-{name}"
        if self.parallel.is_main:
            path = save_checkpoint(
                root,
                name,
                models=models,
                optimizers=optimizers,
                schedulers=learner.schedulers,
                trainer_state=state,
                keep_last=1 if best else keep_last,
                rng_states=rngs,
                weights_only=weights_only or best,
            )
        self.parallel.barrier()
        return path

    def best_path(self) -> Path:
        """The folder of the best model (``save_best_by``)."""
        found = latest_checkpoint(self.best_root)
        if found is None:
            raise FileNotFoundError(
                f"{self.best_root} holds no best model: set save_best_by (and an eval_dataset "
                "with eval_interval > 0) so that training keeps one."
            )
        return found

    def resolve(self, path: str | Path) -> Path:
        """A checkpoint folder, or the newest complete one under ``checkpoints/`` for
        ``"latest"``."""
        if str(path) != "latest":
            return Path(path)
        found = latest_checkpoint(self.root)
        if found is None:
            raise FileNotFoundError(
                f"resume_from_checkpoint='latest' but {self.root} holds no complete checkpoint; "
                "set args.output_dir to the run to resume, or pass a checkpoint folder."
            )
        return found

    def load(
        self,
        path: Path,
        learner: Learner[Any],
        check: Callable[[dict[str, Any]], None],
        *,
        weights_only: bool = False,
    ) -> dict[str, Any]:
        """Restore ``path`` into the learner's models (and, unless ``weights_only``, its
        optimizers, schedulers and this rank's RNG state); returns the saved state. Every file
        is verified and ``check(state)`` run before anything changes."""
        models, optimizers = learner.checkpoint_parts()
        if weights_only:
            return load_checkpoint(path, models=models, check=check, weights_only=True)
        return load_checkpoint(
            path,
            models=models,
            optimizers=optimizers,
            schedulers=learner.schedulers,
            check=check,
            rank=self.parallel.rank,
            world_size=self.parallel.world_size,
        )


def save_models(agents: Sequence[LLMAgent], output_dir: str | Path, parallel: DataParallel) -> None:
    """One ``from_pretrained``-loadable folder per agent: ``output_dir/agent_i``; for an adapter
    agent that folder holds its adapter alone, which ``peft.PeftModel.from_pretrained(base,
    folder)`` loads. Written by rank 0 alone under torchrun: the ranks hold the same weights."""
    for i, agent in enumerate(agents if parallel.is_main else []):
        folder = Path(output_dir) / f"agent_{i}"
        if agent.adapter is None:
            # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
            agent.model.save_pretrained(folder)  # type: ignore[operator]
        else:
            # peft writes a named adapter into <dir>/<name>; write it there, then move it.
            agent.model.save_pretrained(  # type: ignore[operator]  # as above
                folder / "_adapter", selected_adapters=[agent.adapter]
            )
            for file in (folder / "_adapter" / agent.adapter).iterdir():
                file.replace(folder / file.name)
            shutil.rmtree(folder / "_adapter")
        agent.tokenizer.save_pretrained(folder)
    parallel.barrier()
