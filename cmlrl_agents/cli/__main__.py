"""``python -m cmlrl_agents.cli`` runs the ``cmlrl`` command."""

from cmlrl_agents.cli.commands import main

raise SystemExit(main())
