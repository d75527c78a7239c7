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

import csv
import dataclasses
import importlib.util
import io
import json
import operator
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cmlrl_agents.checkpoint import redact_secrets

__all__ = ["WANDB_CONFIG_KEYS", "MetricsLogger", "ProgressBar"]

# `id` and `resume` are accepted because the reference accepted them (continuing a W&B run).
WANDB_CONFIG_KEYS = (
    *("project", "entity", "name", "run_name", "tags", "dir", "config_sections"),
    *("mode", "id", "resume"),
)
_WANDB_MODES = ("online", "offline", "disabled")
_STATE_VERSION = 1


def _jsonable(obj: Any) -> Any:
    """Best-effort JSON form of a run config: configs may carry paths, dataclasses, callables."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return _jsonable(obj.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return repr(obj)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge; on a clash the value in `base` (the run config: what actually ran) wins."""
    merged = dict(extra)
    for key, value in base.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(value), merged[key])
        else:
            merged[key] = value
    return merged


def _check_wandb_config(config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(
            f"wandb_config must be a dict or None, got {type(config).__name__}: {config!r}; "
            f"pass a dict with keys from {list(WANDB_CONFIG_KEYS)} or None to disable W&B."
        )
    unknown = sorted(str(k) for k in config if k not in WANDB_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"wandb_config has unknown key(s) {unknown}; valid keys are {list(WANDB_CONFIG_KEYS)}."
        )
    # A credential pasted into a name or a tag would reach W&B's servers as it is.
    cfg = {k: v if k == "config_sections" else redact_secrets(v) for k, v in config.items()}
    name, run_name = cfg.pop("name", None), cfg.pop("run_name", None)
    if name is not None and run_name is not None and name != run_name:
        raise ValueError(
            f"wandb_config gives name={name!r} and run_name={run_name!r}; they are aliases, "
            "give one of them."
        )
    cfg["name"] = name if name is not None else run_name
    tags = cfg.get("tags")
    if tags is not None and not (
        isinstance(tags, (list, tuple)) and all(isinstance(t, str) for t in tags)
    ):
        raise ValueError(f"wandb_config['tags'] must be a list of strings, got {tags!r}.")
    sections = cfg.get("config_sections")
    if sections is None:
        cfg["config_sections"] = {}
    elif not isinstance(sections, Mapping):
        raise ValueError(
            f"wandb_config['config_sections'] must be a dict, got {type(sections).__name__}: "
            f"{sections!r}."
        )
    mode = cfg.get("mode")
    if mode is not None and mode not in _WANDB_MODES:
        raise ValueError(f"wandb_config['mode'] must be one of {list(_WANDB_MODES)}, got {mode!r}.")
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(
            "wandb_config is set but wandb is not installed; `pip install wandb` (or the "
            "project's [wandb] extra), or pass wandb_config=None to log locally only."
        )
    return cfg


def _resolve_verbose(verbose: bool | None, sections: Mapping[str, Any]) -> bool:
    if verbose is not None:
        return bool(verbose)
    output = sections.get("output")
    if isinstance(output, Mapping) and output.get("verbose") is not None:
        return bool(output["verbose"])
    return sys.stdout.isatty()


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


def _atomic_write_text(path: Path, text: str) -> None:
    # A crash mid-write must not cost the previous content of metrics/eval files.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _csv_rows(fields: list[str], rows: list[tuple[int, dict[str, float]]], *, header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(["env_step", *fields])
    writer.writerows([step, *(m.get(k, "") for k in fields)] for step, m in rows)
    return buffer.getvalue()


class MetricsLogger:
    """Aggregates, stores and forwards metrics (local files, TensorBoard, optional W&B).

    Files in `output_dir` (when given): `config.json`, `metrics.jsonl` (one object per emitted
    entry with `env_step`), `metrics.csv` (columns = union of keys seen so far),
    `eval-metrics.json` (latest evaluation) and `tensorboard/` (when tensorboard is installed).

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
        self._wandb_cfg = None if wandb_config is None else _check_wandb_config(wandb_config)
        sections = self._wandb_cfg["config_sections"] if self._wandb_cfg else {}
        self.config: dict[str, Any] = redact_secrets(
            _merge(_jsonable(dict(run_config or {})), _jsonable(dict(sections)))
        )
        self.verbose = _resolve_verbose(verbose, sections)
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.history: list[tuple[int, dict[str, float]]] = []
        self.last_logged_step = 0
        self._pending: list[tuple[int, dict[str, float]]] = []
        self._last_step = 0
        self._csv_fields: list[str] = []
        self._files_ready = False
        self._tb: Any = None
        self._purge_step: int | None = None
        self._run: Any = None
        self._wandb_run_id: str | None = None
        self._closed = False
        self._config_written = False
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            if write_config:
                self.write_config()

    def write_config(self) -> None:
        """Write `config.json` (done in `__init__` unless `write_config=False`, and at the first
        emission at the latest): a trainer in a folder of another run holds it back until it
        knows whether it resumes that run or replaces it."""
        if self.output_dir is not None:
            text = json.dumps(self.config, indent=2, sort_keys=True)
            _atomic_write_text(self.output_dir / "config.json", text + "\n")
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
        self._emit(self._advance(step, "log_now"), values)

    def log_eval(self, metrics: Mapping[str, Any], step: int) -> None:
        """Emit evaluation metrics at once and write `eval-metrics.json` (with `env_step`)."""
        values = _check_metrics(metrics, "log_eval")
        step = self._advance(step, "log_eval")
        self._emit(step, values)
        if self.output_dir is not None:
            text = json.dumps({"env_step": step, **values}, indent=2)
            _atomic_write_text(self.output_dir / "eval-metrics.json", text + "\n")
        if self.verbose:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items())
            tqdm.write(f"eval @ env_step {step}: {shown}")

    def flush(self) -> None:
        """Emit pending training entries (call at the end of training)."""
        if self._pending:
            self._emit_pending()
        if self._tb:
            self._tb.flush()

    def close(self) -> None:
        """Flush, close TensorBoard and finish the W&B run. Idempotent."""
        if self._closed:
            return
        self.flush()
        if self._tb:
            self._tb.close()
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

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()`; call before logging anything. Rewrites the metric files."""
        if self.history or self._pending or self._closed:
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
        self._wandb_run_id = state.get("wandb_run_id")
        self._purge_step = self.history[-1][0] + 1 if self.history else None
        if self.output_dir is not None:
            self._rewrite_metric_files()
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
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _, entry in self._pending:
            for key, value in entry.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        # The current env_step, not the last pending entry's: a flush after an evaluation at a
        # later step must not go back in time (W&B drops decreasing steps).
        step = self._last_step
        self._pending = []
        self.last_logged_step = step
        self._emit(step, {key: sums[key] / counts[key] for key in sums})

    def _emit(self, step: int, values: dict[str, float]) -> None:
        if self.output_dir is not None and not self._files_ready:
            self._start_files()
        self.history.append((step, values))
        if self.output_dir is not None:
            self._append_to_files(step, values)
            self._write_tensorboard(step, values)
        if self._wandb_cfg is not None:
            self._wandb().log(values, step=step)

    # ---- local files ------------------------------------------------------------------------

    def _start_files(self) -> None:
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

    def _rewrite_metric_files(self) -> None:
        assert self.output_dir is not None
        self._csv_fields = list(dict.fromkeys(k for _, m in self.history for k in m))
        lines = "".join(json.dumps({"env_step": s, **m}) + "\n" for s, m in self.history)
        _atomic_write_text(self.output_dir / "metrics.jsonl", lines)
        csv_text = _csv_rows(self._csv_fields, self.history, header=True)
        _atomic_write_text(self.output_dir / "metrics.csv", csv_text)

    def _append_to_files(self, step: int, values: dict[str, float]) -> None:
        assert self.output_dir is not None
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"env_step": step, **values}) + "\n")
        new_keys = [k for k in values if k not in self._csv_fields]
        if new_keys:
            # The header changes: rewrite the CSV from history so every row has every column.
            self._csv_fields += new_keys
            csv_text = _csv_rows(self._csv_fields, self.history, header=True)
            _atomic_write_text(self.output_dir / "metrics.csv", csv_text)
        else:
            with open(self.output_dir / "metrics.csv", "a", encoding="utf-8") as f:
                f.write(_csv_rows(self._csv_fields, [(step, values)], header=False))

    def _write_tensorboard(self, step: int, values: dict[str, float]) -> None:
        assert self.output_dir is not None
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is an optional extra
                self._tb = False
                return
            # purge_step hides events a crashed segment wrote after the restored history.
            tb_dir = str(self.output_dir / "tensorboard")
            self._tb = SummaryWriter(tb_dir, purge_step=self._purge_step)
        if self._tb:
            for key, value in values.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()

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


class ProgressBar:
    """A tqdm bar over task items that prints nothing when `verbose` is False."""

    def __init__(
        self, total: int | None, *, verbose: bool, desc: str = "", unit: str = "item"
    ) -> None:
        self._bar = tqdm(total=total, desc=desc, unit=unit, disable=not verbose, dynamic_ncols=True)

    def update(self, n: int = 1, postfix: Mapping[str, float] | None = None) -> None:
        """Advance by `n` items and show `postfix` (e.g. `{"reward": 0.41}`) beside the bar."""
        if postfix:
            shown = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in postfix.items()}
            self._bar.set_postfix(shown, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
