"""The seeded fault campaign (``make chaos``): what survives which fault, in figures anyone can rerun.

Modules: ``graph`` (the agent the runner pods run, counting raw tool executions),
``plan`` (a trial's faults from its seed, pure), ``world`` (PostgreSQL, Redis, the
emulated cluster, two operators), ``inject`` (the faults), ``trial`` (one trial and its
baseline), ``evidence`` (what a trial leaves, read back), ``verdict`` (the figures,
pure), ``campaign`` (many trials at once), ``report`` (the JSON and RELIABILITY.md).
"""
