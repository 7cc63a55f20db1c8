"""The agentrun Kubernetes operator: AgentRun resources in, runner pods and status out.

Split by role (import-linter enforces the layers: ``__main__`` > ``io`` > ``decide`` > ``settings``):

- ``decide/``  pure, no I/O and no clock: every decision is unit-tested without an API server.
  The verdict: ``verdict`` (one reconcile's whole verdict: one typed input record in, one ``Decision``
  out), ``run`` (``decide``: the next step of one run), ``decision`` (the typed ``Decision``),
  ``wake`` (the deadlines the clock alone brings, scheduled instead of polled).
  What it reads: ``spec`` (the AgentRun spec model), ``status`` (``AgentRunStatus`` in, ``StatusPatch``
  out), ``classify`` (a pod's outcome), ``thread`` (which run on a thread may start), ``identity``
  (request keys; a request already answered), ``answers`` (an interrupt's answer carried to the next
  attempt), ``outage`` (a store that does not answer), ``podstart`` (pods that cannot start),
  ``access`` (the Secrets and images a run may use), ``hostile`` (specs refused before parsing),
  ``jobparity`` (``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``, ``spec.retry``), ``storeconfig``
  (a store Secret's meaning, a store failure's classification: configuration or outage).
  What it writes: ``reasons`` (phases and the one list of reasons), ``conditions`` (the status patch
  and its conditions), ``attempts`` (``status.attempts``), ``messages`` (``"CODE: text"`` for people),
  ``toolerrors`` (failed tool calls made visible), ``usage`` (``status.modelUsage``), ``growth`` (what a
  written status adds to the counters: the baseline rule), ``podspec`` (the runner pod of an attempt);
- ``io/``      everything that talks to something: ``kube`` (the only module that calls the Kubernetes
  API), ``kubeconfig`` (where its credentials come from), ``caches`` (watch-fed Secrets and pods),
  ``access`` (the Secret reads ``decide.access`` needs), ``stores`` (the run stores: progress reads,
  stop requests), ``notify`` (progress from the stores: PostgreSQL LISTEN, Redis pub/sub),
  ``reconcile`` (gathers the inputs, applies the verdict), ``handlers`` (the kopf handlers), ``runs``
  (the one record the operator keeps per run, dropped by one ``forget``), ``assemble`` (builds the parts
  once, each handed what it calls),
  ``wakeups`` (reconciles besides watch events: progress, deadlines, the resync, retries), ``expiry``
  (the ttl delete), ``leader`` (the Lease), ``metrics``, ``health`` (liveness and the HTTP endpoints);
- ``settings`` the operator's configuration; ``__main__`` the process;
- beside them, for people: ``kubectl_plugin`` (``kubectl agentrun``). What runs the operator on one
  machine (``agentrun-dev``, the launcher) is a development helper outside the image: ``agentrun_dev``
  (``devtools/``).
"""
