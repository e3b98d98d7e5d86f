"""Inline ``spec.redis.url`` values for the tests of the CRD's URL form rules
(and their copy in the model): many URLs built from the pieces where the
operator's reading (urlsplit, validation.check_redis_url) is easy to get wrong
(ports, empty and bracketed hosts, percent-encoded paths, dropped tabs and
newlines), and which of them the operator accepts."""

from __future__ import annotations

import itertools
import random

from stalledpolicy.redis_url.validation import check_redis_url

SCHEMES = ("redis://", "rediss://")
HOSTS = ("h", "redis.queues.svc", "", "[::1]", "[::1", "::1]", ":[::1]", "10.0.0.1", "h%41", "H\t", "ｈ")
PORTS = ("", ":", ":6379", ":0", ":00", ":1", ":65535", ":065535", ":65536", ":99999", ":6s", ":+1",
         ":1:2", ":\n6379", ":6379x", ":٣")
PATHS = ("", "/", "/0", "/15", "/0/", "/1x", "/%31", "/%31%2F", "/1%2f", "/%2F", "/1/2", "//", "/%3", "/1\n2",
         "/0\t", "/x", "/0%", "/2147483647", "/99999999999999999999", "/%%31")
TAILS = ("", "?db=1", "?socket_timeout=5", "?", "#", "?x/1", "?db=x")


def operator_accepts(url: str) -> bool:
    return check_redis_url(url, unix=False, credentials=False) is None


def all_urls() -> list[str]:
    return ["".join(parts) for parts in itertools.product(SCHEMES, HOSTS, PORTS, PATHS, TAILS)]


def accepted_sample(count: int, seed: int = 7) -> list[str]:
    """``count`` URLs the operator accepts (a fixed sample, the edge cases first)."""
    accepted = [url for url in all_urls() if operator_accepts(url)]
    edges = [url for url in accepted if any(mark in url for mark in ("[", "%", "\t", "\n", "ｈ", ":0", ":1:", ":\n"))]
    rest = [url for url in accepted if url not in edges]
    rng = random.Random(seed)
    picked = rng.sample(edges, min(len(edges), count // 2))
    return picked + rng.sample(rest, min(len(rest), count - len(picked)))
