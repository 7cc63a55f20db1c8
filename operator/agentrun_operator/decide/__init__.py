"""Pure decisions: inputs as typed records in, a typed ``Decision`` out; no I/O, no clock, no kopf.

See the package docstring of ``agentrun_operator`` for the module map.
"""
