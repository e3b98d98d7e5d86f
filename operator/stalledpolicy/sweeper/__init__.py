"""``stalledpolicy sweep``: the long-running sweeper of one queue.

``config`` (settings from flags and env), ``loop`` (the pass and the interval
loop), ``failures`` (what a failed pass does: outage backoff, readiness, logs
once per cause), ``metrics`` (Prometheus and the /healthz, /readyz server),
``cli``.
"""
