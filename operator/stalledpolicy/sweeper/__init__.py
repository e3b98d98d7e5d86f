"""``stalledpolicy sweep``: the long-running sweeper of one queue.

``config`` (settings from flags and env), ``loop`` (the pass and the interval
loop), ``metrics`` (Prometheus and the /healthz, /readyz server), ``cli``.
"""
