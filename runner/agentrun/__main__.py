"""``python -m agentrun``: the ``agentrun`` command line."""

from .cli import main

raise SystemExit(main())
