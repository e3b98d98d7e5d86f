"""Whether two Redis endpoints are one server named two ways (one sweeper per
queue, queue_claims.py; whether a policy's status figures came from another
Redis, queue_figures.endpoint_changed): ``redis.prod.svc`` and
``redis.prod.svc.cluster.local`` or the Service's IP, ``localhost`` and
``127.0.0.1``. The URL's scheme is no part
of an endpoint: a port speaks TLS or not, never both.

Two endpoints of equal port and database are the same server when their host
names are equal or resolve to at least one common address. A name that does not
resolve is compared as a name only. A single-label name is taken in the policy's
namespace (``as_seen_from``): that is the Service its sweeper pods reach.

Host names are resolved (``getaddrinfo``, TCP) on a thread of their own, cached
for ``ttl`` seconds, and waited for at most ``wait`` seconds: getaddrinfo cannot
be given a timeout, and a slow DNS must not stall a reconcile or the status loop.
A name whose first lookup has not ended is "cannot be told now" (None), which
the claim rules already treat as "nothing moves" (no sweeper started, a running
one kept), and so is a name whose lookups failed for a reason that may pass (the
DNS server down: asked again after LOOKUP_RETRY seconds); after that, an expired
entry is looked up again while its last answer serves.

A name not asked about for ``forget_after`` seconds (FORGET_AFTER_TTLS times
the TTL: ten minutes) is dropped from the cache: the host names of URLs since
edited and of policies since deleted would otherwise stay for the life of the
operator.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Endpoint = tuple[str, int, int]  # host (lower case), port, database

PENDING: object = object()  # a host name whose first lookup has not ended yet

LOOKUP_TTL = 60.0
LOOKUP_WAIT = 0.5
# After a lookup that failed for a passing reason (a DNS server down or slow):
# asked again this soon, the name "cannot be told" meanwhile if nothing is known.
LOOKUP_RETRY = 5.0
# An entry not asked about for this many TTLs is dropped (HostResolver._forget_unused).
# By age, not a size cap: a cap would evict names still in use once a cluster
# has more of them than the cap, and each would then be "cannot be told" (no
# sweeper moves) while it is looked up again. Ten times the TTL is well over the
# status interval and the longest retry backoff (MAX_BACKOFF, 300 s by default),
# so a name any policy still names is asked about long before it could go. One
# dropped anyway (a STATUS_INTERVAL that long) is merely looked up again as at an
# operator start: "cannot be told" (nothing moves) until its first answer.
FORGET_AFTER_TTLS = 10
# getaddrinfo's answers that say the name does not exist (the others may pass).
_NO_SUCH_NAME = {getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY")
                 if hasattr(socket, name)}


def normal_address(text: str) -> str:
    """One spelling per address (``::ffff:127.0.0.1`` is ``127.0.0.1``)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def ip_literal(host: str) -> str | None:
    try:
        return normal_address(str(ipaddress.ip_address(host)))
    except ValueError:
        return None


def lookup_addresses(host: str) -> Iterable[str]:
    """The addresses a TCP client connecting to ``host`` would try."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


@dataclass
class _Entry:
    addresses: frozenset[str] | None | object = PENDING  # None: the name does not resolve
    checked_at: float = float("-inf")
    lookup_done: threading.Event | None = None  # set when the lookup in flight ends
    asked_at: float = float("-inf")  # the last ``addresses`` call for the name


class HostResolver:
    """Host names to address sets, cached (see the module's docstring)."""

    def __init__(self, lookup: Callable[[str], Iterable[str]] = lookup_addresses, *,
                 ttl: float = LOOKUP_TTL, wait: float = LOOKUP_WAIT,
                 clock: Callable[[], float] = time.monotonic, forget_after: float | None = None) -> None:
        self.lookup, self.ttl, self.wait, self.clock = lookup, ttl, wait, clock
        self.forget_after = FORGET_AFTER_TTLS * ttl if forget_after is None else forget_after
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._forgot_at = float("-inf")

    def addresses(self, host: str) -> frozenset[str] | None | object:
        """The addresses of ``host``; None when it does not resolve; PENDING when its
        first lookup did not end within ``wait`` seconds."""
        literal = ip_literal(host)
        if literal is not None:
            return frozenset({literal})
        with self._lock:
            now = self.clock()
            entry = self._entries.setdefault(host, _Entry())
            entry.asked_at = now
            self._forget_unused(now)
            if entry.lookup_done is None and now - entry.checked_at >= self.ttl:
                entry.lookup_done = threading.Event()
                # A daemon thread, not an executor: a lookup hanging in the C library
                # must not hold up the operator's exit.
                threading.Thread(target=self._look_up, args=(host, entry, entry.lookup_done),
                                 name=f"lookup {host}", daemon=True).start()
            if entry.addresses is not PENDING:
                return entry.addresses
            lookup_done = entry.lookup_done
        if lookup_done is None:  # a lookup failed for a passing reason; asked again soon
            return PENDING
        lookup_done.wait(self.wait)
        with self._lock:
            return entry.addresses

    def _forget_unused(self, now: float) -> None:
        """Drop the entries not asked about for ``forget_after`` seconds (under the
        lock). A scan of the cache at most once per ``ttl``, not on every call. An
        entry whose lookup is in flight stays: its thread writes into it."""
        if now - self._forgot_at < self.ttl:
            return
        self._forgot_at = now
        unused = [host for host, entry in self._entries.items()
                  if entry.lookup_done is None and now - entry.asked_at > self.forget_after]
        for host in unused:
            del self._entries[host]

    def _look_up(self, host: str, entry: _Entry, lookup_done: threading.Event) -> None:
        passing = False
        try:
            found = frozenset(normal_address(address) for address in self.lookup(host)) or None
        except socket.gaierror as exc:
            found, passing = None, exc.errno not in _NO_SUCH_NAME  # EAI_AGAIN, EAI_FAIL: may pass
        except UnicodeError:  # not a name IDNA can encode: does not resolve
            found = None
        except Exception:  # noqa: BLE001 - OSError and the like: may pass
            found, passing = None, True
        with self._lock:
            # A failed lookup keeps the addresses known before: a DNS blip must not
            # end a claim (the newer policy would start a second sweeper). Nor may it
            # pass for "does not resolve" (then "another Redis") before any answer:
            # the name stays PENDING and is asked again soon.
            if found is not None or not (passing or isinstance(entry.addresses, frozenset)):
                entry.addresses = found
            entry.checked_at = self.clock() - (self.ttl - LOOKUP_RETRY if passing else 0.0)
            entry.lookup_done = None
        lookup_done.set()


def as_seen_from(namespace: str, endpoint: Endpoint) -> Endpoint:
    """The endpoint as a sweeper pod of ``namespace`` reaches it: a single-label host
    name (``redis``) is that namespace's Service (``redis.<namespace>.svc``, which
    the cluster DNS's search path completes), not the one of the operator's own
    namespace, and not the one of another policy's namespace either."""
    host = endpoint[0]
    if not namespace or host == "localhost" or "." in host or ":" in host:
        return endpoint
    return (f"{host}.{namespace}.svc",) + endpoint[1:]


def same_server(mine: Endpoint, theirs: Endpoint, hosts: HostResolver) -> bool | None:
    """Whether two endpoints name one server and database; None when that cannot be
    told now (a host name's first lookup still running)."""
    if mine[1:] != theirs[1:]:
        return False
    if mine[0] == theirs[0]:
        return True
    ours, others = hosts.addresses(mine[0]), hosts.addresses(theirs[0])
    if ours is None or others is None:
        return False  # a name that does not resolve: the names differ
    if not isinstance(ours, frozenset) or not isinstance(others, frozenset):
        return None  # PENDING
    return not ours.isdisjoint(others)
