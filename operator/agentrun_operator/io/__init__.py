"""The operator's I/O: the Kubernetes API (``kube`` only), the run stores, kopf handlers, the Lease."""
