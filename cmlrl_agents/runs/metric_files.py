"""The local metric files of a run, written by stable-baselines3's logger.

``MetricsLogger`` (``logging.py``) aggregates and decides *when* to emit; an SB3
``stable_baselines3.common.logger.Logger`` writes each emitted entry to ``metrics.jsonl``
(``JSONOutputFormat``), ``metrics.csv`` (``CSVOutputFormat``) and ``tensorboard/``
(``TensorBoardOutputFormat``), and its ``record_mean`` averages the entries of one emission.

Three things SB3's formats do not do, and why the subclasses below exist:

- A resumed run must keep the rows before its checkpoint, but SB3 opens every file with ``"w"``
  (truncating them): here the JSON and CSV files are opened for appending, the CSV header read
  back.
- SB3 adds new CSV columns in ``set`` order, which changes from process to process (string hash
  randomisation): here they keep the order in which the keys first appeared.
- TensorBoard must hide the events a crashed segment wrote after the restored history
  (``purge_step``), which SB3's writer does not take. The purge starts at the history's last
  step, whose rows are then written again: a checkpoint is taken after its round's entries, and
  the next round's evaluation logs at that same step, so purging after it would keep a crashed
  segment's evaluation beside the resumed one's.

Rewriting the files from the restored history (``rewrite_metric_files``) is ours: SB3 has no
such function.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from stable_baselines3.common import logger as sb3_logger

__all__ = ["STEP_KEY", "atomic_write_text", "open_metric_files", "rewrite_metric_files"]

STEP_KEY = "env_step"
"""The first field of every metrics.jsonl entry and the first CSV column (SPEC §7's index)."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file: a crash mid-write keeps the previous content."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _csv_text(fields: list[str], rows: list[tuple[int, dict[str, float]]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([STEP_KEY, *fields])
    writer.writerows([step, *(m.get(k, "") for k in fields)] for step, m in rows)
    return buffer.getvalue()


def rewrite_metric_files(output_dir: Path, history: list[tuple[int, dict[str, float]]]) -> None:
    """``metrics.jsonl`` and ``metrics.csv`` holding exactly ``history`` (a resumed run)."""
    fields = list(dict.fromkeys(k for _, m in history for k in m))
    lines = "".join(json.dumps({STEP_KEY: s, **m}) + "\n" for s, m in history)
    atomic_write_text(output_dir / "metrics.jsonl", lines)
    atomic_write_text(output_dir / "metrics.csv", _csv_text(fields, history))


class _AppendingJSON(sb3_logger.JSONOutputFormat):
    def __init__(self, filename: Path) -> None:  # SB3 opens with "w"
        self.file = open(filename, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()


class _AppendingCSV(sb3_logger.CSVOutputFormat):
    def __init__(self, filename: Path) -> None:  # SB3 opens with "w+"
        self.file = open(filename, "a+", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.file.seek(0)
        header = self.file.readline()
        self.keys: list[str] = next(csv.reader([header])) if header.strip() else []
        self.separator = ","
        self.quotechar = '"'

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0
    ) -> None:
        shown = sb3_logger.filter_excluded_keys(key_values, key_excluded, "csv")
        new = [k for k in shown if k not in self.keys]
        if new:  # the new header in first-seen order; earlier rows get empty cells
            self.file.seek(0)
            rows = self.file.readlines()[1:]
            self.file.seek(0)
            self.file.truncate()  # "a+" writes at the end, which is now the start
            self.keys += new
            self.file.write(",".join(self.keys) + "\n")
            self.file.writelines(row.rstrip("\n") + "," * len(new) + "\n" for row in rows)
        super().write(key_values, key_excluded, step)  # no extra keys left: SB3 writes the row


class _PurgingTensorBoard(sb3_logger.TensorBoardOutputFormat):
    def __init__(
        self, folder: Path, purge_step: int | None, rows: list[tuple[int, dict[str, float]]]
    ) -> None:
        self.writer = sb3_logger.SummaryWriter(log_dir=str(folder), purge_step=purge_step)
        self._is_closed = False
        for step, values in rows:  # the purged step's rows, as the run logged them
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)


def open_metric_files(
    output_dir: Path,
    purge_step: int | None,
    rows: list[tuple[int, dict[str, float]]] | None = None,
) -> sb3_logger.Logger:
    """An SB3 ``Logger`` appending to the run's metric files (TensorBoard when installed);
    TensorBoard hides the events from ``purge_step`` on and gets ``rows`` again (a resume)."""
    formats: list[sb3_logger.KVWriter] = [
        _AppendingJSON(output_dir / "metrics.jsonl"),
        _AppendingCSV(output_dir / "metrics.csv"),
    ]
    if sb3_logger.SummaryWriter is not None:  # tensorboard is an optional extra
        folder = output_dir / "tensorboard"
        formats.append(_PurgingTensorBoard(folder, purge_step, rows or []))
    return sb3_logger.Logger(str(output_dir), formats)
