"""Local stand-ins for production infrastructure, real programs all: a redis-server,
a Redis Cluster, the Kubernetes control plane and a pod runner. Used by the
tests, the demo and the benchmarks; never by the operator or sweeper themselves.
"""
