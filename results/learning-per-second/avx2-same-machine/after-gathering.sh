# The plan of 2026-12-07 01:50 UTC in ../SEEDS.md: ours seeds 3-5 on core 0, 0-2 on core 1.
cd /work/main
export OMP_NUM_THREADS=1
run() {  # core, seeds...
  core=$1; shift
  for s in "$@"; do
    taskset -c "$core" python benchmarks/learning.py --only cmlrl --yardstick 0.471 378.8 \
      --budget-seconds 120 --epochs 8 --eval-every 2 --threads 1 --seed "$s" \
      > results/learning-per-second/avx2-same-machine/after-gathering/seed-$s.txt 2>&1
  done
}
run 0 3 4 5 &
run 1 0 1 2 &
wait
