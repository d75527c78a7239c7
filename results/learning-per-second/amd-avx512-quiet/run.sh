#!/bin/bash
# waits for CI, then the planned sequence on core 1
while pgrep -f "bash .ci/run" > /dev/null; do sleep 20; done
cd /tmp/frozen  # a git worktree of 4f151d8
export PYTHONPATH=/tmp/frozen OMP_NUM_THREADS=1
run_comlrl() { taskset -c 1 python benchmarks/learning.py --only comlrl --epochs 2 --comlrl-lr 2e-5 --threads 1 --seed 0 > /tmp/lps/comlrl-seed-0-$1.txt 2>&1; }
run_ours() { taskset -c 1 python benchmarks/learning.py --only cmlrl --yardstick 0.471 342.2 --budget-seconds 120 --epochs 8 --eval-every 2 --threads 1 --seed $1 > /tmp/lps/seed-$1.txt 2>&1; }
date > /tmp/lps/started
run_comlrl a
for s in 3 5 0 1 2 4; do run_ours $s; done
run_comlrl b
date > /tmp/lps/finished
