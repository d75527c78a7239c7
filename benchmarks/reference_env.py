"""Shared by the benchmarks that run the reference ``comlrl==1.4.3`` beside this library.

- :func:`reference_python`: a throwaway virtualenv with its own ``torch==2.13.0`` and comlrl.
- :func:`run_child`: one benchmark program in a fresh child process, its ``RESULT {...}`` line
  parsed (each run is a fresh process, so neither library's import or cache state leaks).
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

REFERENCE = "comlrl==1.4.3"
ROOT = Path(__file__).resolve().parents[1]


def reference_python(venv_dir: Path) -> str:
    """A throwaway virtualenv with its own ``torch==2.13.0`` and ``comlrl``.

    It does not borrow this interpreter's site-packages: when this project itself runs in a
    virtualenv, "system" site-packages are the base interpreter's and hold no torch. The shared
    libraries are pinned to the versions installed here, so both sides run the same kernels.
    """
    from importlib.metadata import version

    python = venv_dir / "bin" / "python"
    if not python.exists():
        venv.create(venv_dir, with_pip=True)
    check = subprocess.run([str(python), "-c", "import comlrl, torch"], capture_output=True)
    if check.returncode != 0:
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        # torch first, from the same (CPU) build: a bare requirement would pull a CUDA build.
        subprocess.run([*pip, f"torch=={version('torch')}"], check=True)
        shared = ["transformers", "peft", "datasets", "gymnasium", "pettingzoo", "numpy"]
        pins = [f"{name}=={version(name)}" for name in shared]
        subprocess.run([*pip, REFERENCE, *pins, f"torch=={version('torch')}"], check=True)
    return str(python)


def run_child(python: str, program: str, spec: dict, threads: int) -> dict:
    """Run ``program`` (Python source; ``sys.argv[1]`` is ``spec`` as JSON) with ``python`` and
    return the JSON of its ``RESULT`` line; the child's stderr tail if it printed none."""
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [python, "-c", program, json.dumps(spec)], capture_output=True, text=True, env=env
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
