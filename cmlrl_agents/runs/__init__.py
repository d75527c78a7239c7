"""The training loop, rollouts, evaluation, metrics, logging, checkpoints and plots."""
