"""The run history server: what a run did, read from the store, shown to whoever Kubernetes lets see it.

``python -m agentrun_history`` serves JSON (``/api/v1/...``) and a web view
(``/runs``) of AgentRuns' histories (``agentrun.history``), live while a run
runs (server-sent events fed by the store's ``agentrun_progress``
notifications), with approve / reject / stop buttons.

Authorization is the caller's own Kubernetes identity, never the server's:
every request carries the user's bearer token (an ``Authorization`` header,
``kubectl agentrun ui``'s local proxy, or the token login's cookie), and the
server reads the AgentRun from the API server WITH THAT TOKEN before it shows
anything of it; approve, reject, retry and stop are patches of the AgentRun's spec
made with that token, so RBAC decides and the audit log names the person.
The server itself holds no Kubernetes rights (the chart mounts no service
account token): it reads only its store, with a DSN from its Secret.
"""
