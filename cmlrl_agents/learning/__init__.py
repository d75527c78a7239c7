"""The learning core every family shares: the training batch, credit, the policy objective
over scored rows, and the one gradient-step engine (see engine.py)."""
