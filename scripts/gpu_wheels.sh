#!/usr/bin/env bash
# Downloads into .whl/ the wheels a CUDA machine with PyTorch, transformers, peft, accelerate,
# safetensors, numpy, pandas, pyarrow, matplotlib, pyyaml, tqdm and pytest lacks to run
# scripts/gpu_check.py and the suite's device tests (docs/gpu.md): our dependencies that such an
# image does not hold, and theirs. Python 3.12, manylinux x86_64, no dependencies resolved (each
# is named here), one version each: the versions this project's CPU environment runs.
# .whl/ is git-ignored; never commit wheels.
#
#     scripts/gpu_wheels.sh                 # 7 wheels, about 2 MiB
#     scripts/gpu_wheels.sh --with-pyarrow  # also pyarrow 26.0.1 (53 MiB), for an image whose
#                                           # pyarrow is older than datasets' floor (24.0.0)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    "datasets==5.2.0"               # cmlrl_env's task items
    "dill==0.4.1"                   # datasets
    "multiprocess==0.70.19"         # datasets
    "gymnasium==1.4.0"              # cmlrl_env's spaces
    "farama-notifications==0.0.6"   # gymnasium
    "pettingzoo==1.27.0"            # cmlrl_env's ParallelEnv
    "stable-baselines3==2.9.2"      # cmlrl_agents' metric files (its logger)
)
case "${1:-}" in
    "") ;;
    --with-pyarrow) WHEELS+=("pyarrow==26.0.1") ;;
    *) echo "unknown argument ${1}; the only option is --with-pyarrow" >&2; exit 2 ;;
esac
LIMIT_MIB=60  # the device's working tree travels in 64 MiB, the repository included

rm -rf .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}"

count=$(find .whl -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
    echo "expected ${#WHEELS[@]} wheels in .whl/, found $count:" >&2
    ls .whl >&2
    exit 1
fi
bytes=$(du -sb .whl | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
ls -l .whl
echo "total: $bytes bytes (${mib} MiB, limit ${LIMIT_MIB} MiB)"
if [ "$mib" -gt "$LIMIT_MIB" ]; then
    echo "the wheels take ${mib} MiB, over the ${LIMIT_MIB} MiB that may travel" >&2
    exit 1
fi
