"""Training and evaluation metrics: aggregation, local files, TensorBoard and W&B.

Every trainer reports through one `MetricsLogger`:

- `log_train(metrics, step)` accumulates entries and, once `step - last_logged_step >=
  logging_steps`, emits the per-key mean of everything accumulated at that step. The reference
  dropped the entries in between (bug B15); averaging keeps every reward in the record.
- `log_eval(metrics, step)` emits at once (keys as given, normally `eval/...`) and rewrites
  `eval-metrics.json`.
- `flush()` emits what is still pending; `close()` flushes and ends the W&B run. Nothing else
  ends the run (the reference's `save_model` did: bug B17).

`step` is the `env_step` of SPEC §7: the number of joint-action reward evaluations so far.
"""

from __future__ import annotations

import json
import operator
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

# The run-config and W&B-settings checks live in logging_config.py (re-exported here).
from cmlrl_agents.runs.logging_config import (
    WANDB_CONFIG_KEYS,
    check_wandb_config,
    jsonable,
    merge_config,
    resolve_verbose,
)
from cmlrl_agents.runs.metric_files import (
    STEP_KEY,
    atomic_write_text,
    open_metric_files,
    rewrite_metric_files,
)
from cmlrl_agents.runs.progress import ProgressBar
from cmlrl_agents.runs.redaction import redact_secrets

__all__ = ["WANDB_CONFIG_KEYS", "MetricsLogger", "ProgressBar"]

_STATE_VERSION = 1


def _check_metrics(metrics: Mapping[str, Any], method: str) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"{method}(metrics=...) needs a dict of str -> number, got {type(metrics).__name__}."
        )
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or key == "env_step":
            raise ValueError(
                f"{method}: metric key {key!r} is not allowed; use string keys other than "
                "'env_step' (the step is passed separately)."
            )
        try:
            if isinstance(value, (str, bytes)):  # float("0.5") would hide a caller's bug
                raise TypeError
            values[key] = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"{method}: metric {key!r} = {value!r} is not a number; log numbers only."
            ) from None
    return values


class MetricsLogger:
    """Aggregates, stores and forwards metrics (local files, TensorBoard, optional W&B).

    Files in `output_dir` (when given): `config.json`, `metrics.jsonl` (one object per emitted
    entry with `env_step`), `metrics.csv` (columns = union of keys seen so far),
    `eval-metrics.json` (latest evaluation) and `tensorboard/` (when tensorboard is installed);
    the metric files and TensorBoard are written by stable-baselines3's logger
    (`cmlrl_agents.runs.metric_files`), whose `record_mean` also averages the entries of an
    emission.

    Resuming: construct as usual, then `load_state_dict(saved)` before logging. The metric files
    are rewritten from the restored history, so entries logged after that checkpoint (which the
    resumed run logs again) are not duplicated and nothing before it is lost. A fresh logger that
    finds metric files of an earlier run moves them to `metrics.<n>.jsonl`/`.csv` first.
    """

    def __init__(
        self,
        output_dir: str | Path | None,
        *,
        logging_steps: int,
        wandb_config: Mapping[str, Any] | None = None,
        run_config: Mapping[str, Any] | None = None,
        verbose: bool | None = None,
        write_config: bool = True,
    ) -> None:
        if (
            isinstance(logging_steps, bool)
            or not isinstance(logging_steps, int)
            or logging_steps < 0
        ):
            raise ValueError(
                f"logging_steps must be an int >= 0 (0 logs every entry), got {logging_steps!r}."
            )
        if run_config is not None and not isinstance(run_config, Mapping):
            raise TypeError(f"run_config must be a dict, got {type(run_config).__name__}.")
        self.logging_steps = logging_steps
        self._wandb_cfg = None if wandb_config is None else check_wandb_config(wandb_config)
        sections = self._wandb_cfg["config_sections"] if self._wandb_cfg else {}
        self.config: dict[str, Any] = self._merged_config(run_config or {})
        self.verbose = resolve_verbose(verbose, sections)
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.history: list[tuple[int, dict[str, float]]] = []
        self.last_logged_step = 0
        self._pending: list[tuple[int, dict[str, float]]] = []
        self._last_step = 0
        self._files: Any = None  # the SB3 Logger over the metric files, opened at first use
        self._files_ready = False
        self._purge_step: int | None = None
        self._run: Any = None
        # Chosen now, not by wandb.init at the first emission: a checkpoint written before that
        # (eval_interval=0, logging_steps above the rounds so far) still names the run to resume.
        self._wandb_run_id: str | None = (
            None if self._wandb_cfg is None else self._wandb_cfg.get("id") or secrets.token_hex(4)
        )
        self._closed = False
        self._config_written = False
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            if write_config:
                self.write_config()

    def _merged_config(self, run_config: Mapping[str, Any]) -> dict[str, Any]:
        """The run's config with the W&B ``config_sections``, secrets redacted."""
        sections = self._wandb_cfg["config_sections"] if self._wandb_cfg else {}
        return redact_secrets(merge_config(jsonable(dict(run_config)), jsonable(dict(sections))))

    def record_config(self, run_config: Mapping[str, Any]) -> None:
        """Record the config a run uses (a trainer calls it at every ``train()``: fields
        changed since construction included) in ``config.json`` and the W&B run's config."""
        self.config = self._merged_config(run_config)
        self.write_config()
        if self._run is not None:
            self._run.config.update(self.config, allow_val_change=True)

    def write_config(self) -> None:
        """Write `config.json` (done in `__init__` unless `write_config=False`, and at the first
        emission at the latest): a trainer in a folder of another run holds it back until it
        knows whether it resumes that run or replaces it."""
        if self.output_dir is not None:
            text = json.dumps(self.config, indent=2, sort_keys=True)
            atomic_write_text(self.output_dir / "config.json", text + "\n")
        self._config_written = True

    # ---- public API -------------------------------------------------------------------------

    def log_train(self, metrics: Mapping[str, Any], step: int) -> None:
        """Accumulate one training entry; emit the mean of the pending entries when due.

        Log all keys of one step in one call: a second call at the same step waits for the next
        emission (its step gap to the last emission is 0).
        """
        values = _check_metrics(metrics, "log_train")
        step = self._advance(step, "log_train")
        self._pending.append((step, values))
        if step - self.last_logged_step >= self.logging_steps:
            self._emit_pending()

    def log_now(self, metrics: Mapping[str, Any], step: int) -> None:
        """Emit ``metrics`` at once at ``step``, outside the ``logging_steps`` gap (IAC/MAAC's
        ``metrics_callback`` values, logged at rollout collection: SPEC §7)."""
        values = _check_metrics(metrics, "log_now")
        step = self._advance(step, "log_now")
        self._emit(step, [(step, values)])

    def log_eval(self, metrics: Mapping[str, Any], step: int) -> None:
        """Emit evaluation metrics at once and write `eval-metrics.json` (with `env_step`)."""
        values = _check_metrics(metrics, "log_eval")
        step = self._advance(step, "log_eval")
        self._emit(step, [(step, values)])
        if self.output_dir is not None:
            text = json.dumps({"env_step": step, **values}, indent=2)
            atomic_write_text(self.output_dir / "eval-metrics.json", text + "\n")
        if self.verbose:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items())
            tqdm.write(f"eval @ env_step {step}: {shown}")
            sys.stdout.flush()  # a log file or notebook sees the line now, not at the end

    def flush(self) -> None:
        """Emit pending training entries (call at the end of training)."""
        if self._pending:
            self._emit_pending()

    def close(self) -> None:
        """Flush, close TensorBoard and finish the W&B run. Idempotent."""
        if self._closed:
            return
        self.flush()
        if self._files is not None:
            self._files.close()
        if self._run is not None:
            self._run.finish()
        self._closed = True

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints (history, pending entries, W&B run id)."""
        return {
            "version": _STATE_VERSION,
            "last_logged_step": self.last_logged_step,
            "last_step": self._last_step,
            "pending": [[s, dict(m)] for s, m in self._pending],
            "history": [[s, dict(m)] for s, m in self.history],
            "wandb_run_id": self._wandb_run_id,
        }

    @property
    def fresh(self) -> bool:
        """Whether nothing has been logged through this logger (and it is open)."""
        return not (self.history or self._pending or self._closed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()`; call before logging anything. Rewrites the metric files."""
        if not self.fresh:
            raise RuntimeError(
                "MetricsLogger.load_state_dict must be called on a fresh logger, before any "
                "log_train/log_eval call."
            )
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state is not a MetricsLogger.state_dict() of version {_STATE_VERSION}: "
                f"got {str(state)[:200]!r}."
            )
        self.last_logged_step = int(state["last_logged_step"])
        self._last_step = int(state["last_step"])
        self._pending = [
            (int(s), _check_metrics(m, "load_state_dict")) for s, m in state["pending"]
        ]
        self.history = [(int(s), _check_metrics(m, "load_state_dict")) for s, m in state["history"]]
        self._wandb_run_id = state.get("wandb_run_id") or self._wandb_run_id
        self._purge_step = self.history[-1][0] if self.history else None
        if self.output_dir is not None:
            rewrite_metric_files(self.output_dir, self.history)
            self._files_ready = True

    # ---- emission ---------------------------------------------------------------------------

    def _advance(self, step: int, method: str) -> int:
        if self._closed:
            raise RuntimeError(f"{method} called after MetricsLogger.close().")
        if isinstance(step, bool) or not hasattr(step, "__index__") or operator.index(step) < 0:
            raise ValueError(f"{method}: step must be an int >= 0 (the env_step), got {step!r}.")
        step = operator.index(step)  # numpy / torch integers become plain ints
        if step < self._last_step:
            raise ValueError(
                f"{method}: step={step} is lower than the previous step {self._last_step}; "
                "env_step must never decrease (W&B drops such entries)."
            )
        self._last_step = step
        return step

    def _emit_pending(self) -> None:
        # The current env_step, not the last pending entry's: a flush after an evaluation at a
        # later step must not go back in time (W&B drops decreasing steps).
        step = self._last_step
        pending, self._pending = self._pending, []
        self.last_logged_step = step
        self._emit(step, pending)

    def _emit(self, step: int, entries: list[tuple[int, dict[str, float]]]) -> None:
        """Emit the per-key mean of ``entries`` (SB3's ``record_mean``) at ``step``."""
        files = self._metric_files()
        files.record(STEP_KEY, step, exclude="tensorboard")  # the first field and column
        for _, entry in entries:
            for key, value in entry.items():
                files.record_mean(key, value)
        values = {k: float(v) for k, v in files.name_to_value.items() if k != STEP_KEY}
        self.history.append((step, values))
        files.dump(step)  # without an output_dir there are no formats: this clears the record
        if self._wandb_cfg is not None:
            self._wandb().log(values, step=step)

    def _metric_files(self) -> Any:
        if self._files is None:
            if self.output_dir is None:
                from stable_baselines3.common.logger import Logger

                self._files = Logger(None, [])  # aggregation only
            else:
                if not self._files_ready:
                    self._start_files()
                purged = [(s, m) for s, m in self.history if s == self._purge_step]
                self._files = open_metric_files(self.output_dir, self._purge_step, purged)
        return self._files

    # ---- local files ------------------------------------------------------------------------

    def _start_files(self) -> None:
        """Move an earlier run's metric files aside (SB3 has no such step: ours)."""
        assert self.output_dir is not None
        if not self._config_written:
            self.write_config()
        old = [self.output_dir / n for n in ("metrics.jsonl", "metrics.csv")]
        if any(p.exists() for p in old):
            n = 1
            while any((self.output_dir / f"metrics.{n}{p.suffix}").exists() for p in old):
                n += 1
            for path in old:
                if path.exists():
                    path.rename(self.output_dir / f"metrics.{n}{path.suffix}")
        self._files_ready = True

    # ---- W&B --------------------------------------------------------------------------------

    def _wandb(self) -> Any:
        # Started at the first emission, not in __init__, so that a resumed logger can reopen
        # the checkpointed run id.
        if self._run is None:
            import wandb

            cfg = self._wandb_cfg or {}
            kwargs: dict[str, Any] = {
                key: cfg[key] for key in ("project", "entity", "name", "mode") if cfg.get(key)
            }
            if cfg.get("tags"):
                kwargs["tags"] = list(cfg["tags"])
            if cfg.get("dir"):
                Path(cfg["dir"]).mkdir(parents=True, exist_ok=True)
                kwargs["dir"] = str(cfg["dir"])
            run_id = cfg.get("id") or self._wandb_run_id
            if run_id:
                kwargs["id"] = run_id
                kwargs["resume"] = cfg.get("resume", "allow")
            elif cfg.get("resume") is not None:
                kwargs["resume"] = cfg["resume"]
            self._run = wandb.init(config=self.config, reinit="create_new", **kwargs)
            self._wandb_run_id = getattr(self._run, "id", None) or run_id
        return self._run
