"""Bounded stalled-job recovery for EchoMQ queues, declared as Kubernetes StalledPolicy resources."""

__version__ = "0.1.0"
