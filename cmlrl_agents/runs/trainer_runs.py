"""The trainer's side of runs: saving models and checkpoints, resuming, owning the run folder.

Mixed into :class:`cmlrl_agents.runs.trainer.TeamTrainer`; see :mod:`cmlrl_agents.runs.run_dirs` for
the rules (one run per folder, identity checked before any weight is loaded) and
:mod:`cmlrl_agents.runs.checkpoint` for the files.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.runs.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from cmlrl_agents.runs.config import SharedConfig
from cmlrl_agents.runs.distributed import data_parallel
from cmlrl_agents.runs.logging import MetricsLogger
from cmlrl_agents.runs.run_dirs import (
    check_identity,
    clear_checkpoints,
    dataset_fingerprint,
    foreign_checkpoints,
)

__all__ = ["RunMixin", "resume_target", "train_kwargs_error"]

# comlrl's train() took its checkpoint settings and extra generate() kwargs.
_COMLRL_TRAIN_KWARGS = {
    "checkpoint_dir": "args.output_dir (checkpoints go to output_dir/checkpoints/)",
    "checkpoint_interval": "args.save_steps (counted in training task items, not epochs)",
    "checkpoint_total_limit": "args.save_total_limit",
}


def train_kwargs_error(kwargs: dict[str, Any]) -> TypeError:
    """The error for keyword arguments that ``train()`` does not take, saying where each goes."""
    other = (
        "a config field if it is a generation setting (max_new_tokens, temperature, top_p, "
        "top_k, min_new_tokens); other generate() options are not supported"
    )
    parts = [f"{name} -> {_COMLRL_TRAIN_KWARGS.get(name, other)}" for name in kwargs]
    return TypeError("train() takes only resume_from_checkpoint; got " + "; ".join(parts) + ".")


def resume_target(value: Any) -> str | Path | None:
    """``resume_from_checkpoint`` as a folder, ``"latest"`` or None; ``True`` means "latest"
    and ``False`` None (the Hugging Face idiom)."""
    if value is True:
        return "latest"
    if value is None or value is False:
        return None
    if isinstance(value, (str, Path)) and str(value):
        return value
    raise TypeError(
        f"resume_from_checkpoint must be a checkpoint folder, 'latest', True (= 'latest') or "
        f"None, got {value!r}."
    )


class RunMixin:
    """Checkpoints and the run folder (needs the attributes TeamTrainer sets)."""

    algorithm: str
    args: SharedConfig
    agents: list[LLMAgent]
    generation_backend: Any
    learner: Any
    """The algorithm's learner: ``checkpoint_parts()`` and ``apply_learning_rates()``."""
    logger: MetricsLogger
    run_dir: Path
    run_id: str
    num_agents: int
    model_names: list[str]
    env: Any
    epoch: int
    epoch_position: int
    items_seen: int
    env_step: int

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this trainer to be resumed (see run_dirs.py)."""
        config = self.args.to_dict()
        return {
            **self._team_identity(),
            "num_turns": config["num_turns"],
            "num_generations": config["num_generations"],
        }

    def _team_identity(self) -> dict[str, Any]:
        """The part of :meth:`_identity` every trainer shares: algorithm, team and data."""
        data = None if self.env is None else self.env.spec.dataset
        return {
            "algorithm": self.algorithm,
            "num_agents": self.num_agents,
            "models": self.model_names,
            "model_classes": [type(a.model).__name__ for a in self.agents],
            "model_parameters": [sum(p.numel() for p in a.model.parameters()) for a in self.agents],
            "train_dataset": dataset_fingerprint(data),
        }

    # -- the run folder ---------------------------------------------------------------------
    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def _start_fresh(self) -> None:
        """Refuse (or, with ``overwrite_output_dir``, delete) another run's checkpoints."""
        foreign = foreign_checkpoints(self.checkpoint_root, self.run_id)
        if foreign and not self.args.overwrite_output_dir:
            names = ", ".join(p.name for p in foreign)
            raise FileExistsError(
                f"{self.run_dir} holds checkpoints of another run ({names}); a fresh run "
                "there would mix with it. Resume it with "
                "train(resume_from_checkpoint='latest'), set args.overwrite_output_dir=True to "
                "replace it (its checkpoints are deleted), or choose another output_dir."
            )
        if data_parallel().is_main:
            clear_checkpoints(foreign)
        data_parallel().barrier()  # no rank starts while rank 0 is still deleting

    def _prepare_schedule(self) -> None:
        raise NotImplementedError  # TeamTrainer: it knows the run's rounds

    def _apply_learning_rates(self) -> None:
        """The config's learning rates win over those a resumed optimizer brings."""
        self.learner.apply_learning_rates()

    # -- saving -------------------------------------------------------------------------------
    def save_model(self, output_dir: str | Path) -> None:
        """One ``from_pretrained``-loadable folder per agent: ``output_dir/agent_i``; for an
        adapter agent that folder holds its adapter alone, which
        ``peft.PeftModel.from_pretrained(base, folder)`` loads. Written by rank 0 alone under
        torchrun: the ranks hold the same weights."""
        for i, agent in enumerate(self.agents if data_parallel().is_main else []):
            folder = Path(output_dir) / f"agent_{i}"
            if agent.adapter is None:
                agent.model.save_pretrained(folder)
            else:
                # peft writes a named adapter into <dir>/<name>; write it there, then move it.
                agent.model.save_pretrained(folder / "_adapter", selected_adapters=[agent.adapter])
                for file in (folder / "_adapter" / agent.adapter).iterdir():
                    file.replace(folder / file.name)
                shutil.rmtree(folder / "_adapter")
            agent.tokenizer.save_pretrained(folder)
        data_parallel().barrier()

    def _maybe_checkpoint(self, added: int) -> None:
        every = self.args.save_steps
        if every and self.items_seen // every != (self.items_seen - added) // every:
            self.save_checkpoint()

    def _checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """The trainable models and their optimizers, by name (the learner's)."""
        return self.learner.checkpoint_parts()

    def save_checkpoint(self) -> Path:
        """``run_dir/checkpoints/checkpoint-<items seen>``: weights, optimizers, RNG, position,
        metric history, the config and the run's identity, written atomically; the newest
        ``save_total_limit`` are kept.

        Frozen reference models are not saved: they are the initial weights, which the trainer
        that resumes is built from again.
        """
        self._prepare_schedule()
        models, optimizers = self._checkpoint_parts()
        state = {
            "algorithm": self.algorithm,
            "run": {"run_id": self.run_id, "identity": self._identity()},
            "epoch": self.epoch,
            "epoch_position": self.epoch_position,
            "items_seen": self.items_seen,
            "env_step": self.env_step,
            "logger": self.logger.state_dict(),
            "config": self.args.to_dict(),
        }
        parallel = data_parallel()  # rank 0 writes; the others wait until it is complete
        if not parallel.is_main:
            parallel.barrier()
            return self.checkpoint_root / f"checkpoint-{self.items_seen}"
        path = save_checkpoint(
            self.checkpoint_root,
            self.items_seen,
            models=models,
            optimizers=optimizers,
            schedulers=self.learner.schedulers,
            trainer_state=state,
            keep_last=self.args.save_total_limit,
        )
        parallel.barrier()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint folder, or ``"latest"`` under this run's ``checkpoints/``.

        Every file is verified and the run identity compared before anything changes: a
        refused or damaged checkpoint leaves the trainer as it was.
        """
        if str(path) == "latest":
            found = latest_checkpoint(self.checkpoint_root)
            if found is None:
                raise FileNotFoundError(
                    f"resume_from_checkpoint='latest' but {self.checkpoint_root} holds no "
                    "complete checkpoint; set args.output_dir to the run to resume, or pass a "
                    "checkpoint folder."
                )
            path = found
        path = Path(path)
        self._prepare_schedule()  # the schedulers exist before their state is loaded
        models, optimizers = self._checkpoint_parts()
        state = load_checkpoint(
            path,
            models=models,
            optimizers=optimizers,
            schedulers=self.learner.schedulers,
            check=lambda s: self._check_state(s, path),
        )
        self.run_id = state["run"]["run_id"]
        self.epoch, self.epoch_position = state["epoch"], state["epoch_position"]
        self.items_seen, self.env_step = state["items_seen"], state["env_step"]
        self.logger.load_state_dict(state["logger"])
        self._apply_learning_rates()
        self.generation_backend.sync(self.agents)  # the restored weights, also in the backend

    def _check_state(self, state: dict[str, Any], path: Path) -> None:
        if state.get("algorithm") != self.algorithm:
            raise ValueError(
                f"{path} was written by the {state.get('algorithm')} trainer, not "
                f"{self.algorithm}; resume it with that trainer."
            )
        if not isinstance(state.get("run"), dict):
            raise ValueError(f"{path} records no run identity; it was not written by a trainer.")
        check_identity(state["run"]["identity"], self._identity(), path)
