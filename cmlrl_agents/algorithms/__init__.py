"""Learners and trainers: the MAGRPO family, the actor-critics, preference RL."""
