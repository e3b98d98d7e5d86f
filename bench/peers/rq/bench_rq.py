"""RQ's own recovery of abandoned jobs, driven step by step by bench/peers/run.py.

Runs in RQ's own venv (bench/peers/work/rq-venv), never the project's python.

    python bench_rq.py seed N     N jobs enqueued with Queue.enqueue_many (each
                                  with Retry(max=3), so an abandoned job goes back
                                  to its queue rather than to failed), then taken
                                  the way a worker takes them: popped from the
                                  queue, an Execution created (StartedJobRegistry
                                  entry ``{job_id}:{execution_id}``, heartbeat TTL
                                  1 s) and the job marked started. Nobody
                                  heartbeats again: the worker died.
    python bench_rq.py recover    StartedJobRegistry.cleanup(), as a worker's
                                  clean_registries() calls it, once a line
                                  arrives on stdin (after it printed "ready");
                                  prints JSON.
    python bench_rq.py verify N   the registry is empty and every job is back in
                                  the queue, status queued, once; prints JSON.

Redis port in BENCH_REDIS_PORT. The queue is "bench".
"""

from __future__ import annotations

import json
import os
import sys
import time

from redis import Redis
from rq import Queue, Retry
from rq.executions import Execution
from rq.registry import StartedJobRegistry

QUEUE = "bench"
CHUNK = 2_000
WORKER = "dead-worker"
HEARTBEAT_TTL = 1


def connect() -> Redis:
    return Redis(host="127.0.0.1", port=int(os.environ["BENCH_REDIS_PORT"]))


def seed(n: int) -> dict:
    connection = connect()
    queue = Queue(QUEUE, connection=connection)
    for start in range(0, n, CHUNK):
        jobs = queue.enqueue_many([
            Queue.prepare_data("builtins.print", args=("user@example.com", "welcome", i), retry=Retry(max=3))
            for i in range(start, min(n, start + CHUNK))
        ])
        with connection.pipeline() as pipe:
            for job in jobs:
                pipe.lrem(queue.key, 1, job.id)  # the worker's dequeue
                Execution.create(job, HEARTBEAT_TTL, pipeline=pipe, worker_name=WORKER)
                job.prepare_for_execution(WORKER, pipeline=pipe)
                pipe.persist(job.key)
            pipe.execute()
    registry = StartedJobRegistry(QUEUE, connection=connection)
    time.sleep(HEARTBEAT_TTL + 1.1)  # every heartbeat lapsed
    expired = len(registry.get_expired_job_ids())
    if expired != n or queue.count != 0:
        raise SystemExit(f"seed: {expired} expired, {queue.count} queued; expected {n} and 0")
    return {"seeded": n, "expired": expired}


def _timed(method, longest: list[float], calls: list[int]):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            longest[0] = max(longest[0], time.perf_counter() - t0)
            calls[0] += 1
    return wrapper


def recover() -> dict:
    """cleanup() untouched; every round trip it makes (each command, each
    pipeline's MULTI/EXEC) is timed from the client side."""
    import redis.client

    longest, calls = [0.0], [0]
    redis.client.Redis.execute_command = _timed(redis.client.Redis.execute_command, longest, calls)
    redis.client.Pipeline.execute = _timed(redis.client.Pipeline.execute, longest, calls)
    connection = connect()
    registry = StartedJobRegistry(QUEUE, connection=connection)
    connection.ping()
    print("ready", flush=True)  # run.py starts its PING client, then says go
    sys.stdin.readline()
    started = time.perf_counter()
    registry.cleanup()
    return {"seconds": time.perf_counter() - started, "longest_call_s": longest[0], "calls": calls[0]}


def verify(n: int) -> dict:
    connection = connect()
    queue = Queue(QUEUE, connection=connection)
    registry = StartedJobRegistry(QUEUE, connection=connection)
    ids = queue.get_job_ids()
    statuses = []
    for start in range(0, len(ids), CHUNK):
        with connection.pipeline(transaction=False) as pipe:
            for job_id in ids[start:start + CHUNK]:
                pipe.hget(f"rq:job:{job_id}", "status")
            statuses.extend(pipe.execute())
    queued = sum(1 for s in statuses if s == b"queued")
    in_registry = connection.zcard(registry.key)
    result = {"in_registry": in_registry, "queued_ids": len(ids), "unique": len(set(ids)),
              "status_queued": queued, "failed": queue.failed_job_registry.count}
    result["ok"] = in_registry == 0 and len(ids) == n and len(set(ids)) == n and queued == n
    return result


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"seed", "recover", "verify"}:
        print("usage: bench_rq.py seed N | recover | verify N", file=sys.stderr)
        return 2
    mode = argv[0]
    result = seed(int(argv[1])) if mode == "seed" else recover() if mode == "recover" else verify(int(argv[1]))
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
