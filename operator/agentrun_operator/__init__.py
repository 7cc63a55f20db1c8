"""The agentrun Kubernetes operator: AgentRun resources in, runner pods and status out.

Split by role (import-linter enforces the layers: ``io`` > ``decide`` > ``settings``):

- ``decide/``  pure, no I/O and no clock: every decision is unit-tested without an API server;
  ``spec`` (the AgentRun spec model), ``status`` (``AgentRunStatus`` in, ``StatusPatch`` out),
  ``reasons`` (phases and the one list of status reasons), ``classify`` (a pod's outcome),
  ``thread`` (which run on a thread may start), ``run`` (``decide``: the next step of one run),
  ``decision`` (the typed verdict), ``conditions`` (the status patch and its conditions),
  ``podspec`` (the runner pod of an attempt);
- ``io/``      everything that talks to something: ``kube`` (the only module that calls the Kubernetes
  API), ``stores`` (the run stores: progress reads, stop requests), ``reconcile`` (gathers the inputs,
  applies a decision), ``handlers`` (the kopf handlers and indexes), ``leader`` (the Lease),
  ``metrics``;
- ``settings`` the operator's configuration; ``__main__`` the process.
"""
