"""The agentrun Kubernetes operator: AgentRun resources in, runner pods and status out.

Layers (kept apart so every decision is unit-tested without an API server):
- ``spec``       the AgentRun spec as a pydantic model (validates what the API server may not);
- ``decisions``  pure: the run's status, its current pod and the store's progress in, actions out;
- ``podspec``    pure: the runner pod manifest for an attempt;
- ``kube``       the only module that talks to the Kubernetes API;
- ``store``      the operator's view of the run store (progress reads, stop requests);
- ``reconcile``  ties them together for one AgentRun;
- ``handlers``   the kopf handlers that call ``reconcile``;
- ``leader``     Lease-based leader election; ``__main__`` the process.
"""
