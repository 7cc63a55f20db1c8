"""The operator's I/O: gathers a reconcile's inputs and applies its verdict; only ``kube`` calls the API.

See the package docstring of ``agentrun_operator`` for the module map.
"""
