"""What the learners and the loop both build on: validated configs, data parallelism, the rollout
tree and the metric names. It imports only ``policies/`` and ``functional/`` below it."""
