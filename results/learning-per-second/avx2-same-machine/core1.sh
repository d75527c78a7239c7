cd /work/main
export OMP_NUM_THREADS=1
for s in 0 1 2; do
  taskset -c 1 python benchmarks/learning.py --only cmlrl --yardstick 0.471 376.9 --budget-seconds 200 --epochs 8 --eval-every 2 --threads 1 --seed $s > /tmp/tt/seed-$s.txt 2>&1
done
taskset -c 1 python benchmarks/learning.py --only comlrl --epochs 2 --comlrl-lr 2e-5 --threads 1 --seed 0 > /tmp/tt/comlrl-seed-0-core1.txt 2>&1
