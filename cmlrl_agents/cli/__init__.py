"""The ``cmlrl`` command: run files, task building, plans and paper tasks."""

from cmlrl_agents.cli.commands import main

__all__ = ["main"]
