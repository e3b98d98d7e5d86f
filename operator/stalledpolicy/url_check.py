"""The start-up check of a Redis URL for our command-line tools.

:func:`stalledpolicy.redis_url.check_redis_url` judges the URL's own parts
(scheme, host, port, database, the query options redis-py converts). A few
options are refused by redis-py only when it builds a connection: an option
it does not know (``?foo=1``, a TypeError at the first command) and values it
checks there (``?protocol=9``, ``?ssl_cert_reqs=bogus``). Building one
connection object opens no socket, so this finds them at start, before any
outage handling could mistake them for an unreachable server.
"""

from __future__ import annotations

import re

from stalledpolicy.redis_url import check_redis_url, scrub


def redis_url_problem(url: str) -> str | None:
    """What is wrong with ``url``, as a phrase to follow the setting's name, or
    None. The phrase holds no password (see ``check_redis_url``'s contract)."""
    problem = check_redis_url(url)
    if problem is not None:
        return problem
    return _connection_options_problem(url)


def _connection_options_problem(url: str) -> str | None:
    import redis

    try:
        pool = redis.ConnectionPool.from_url(url)
        pool.make_connection()
    except TypeError as exc:
        named = re.search(r"keyword argument '(\w{1,64})'", str(exc))
        option = f" ({named.group(1)})" if named else ""
        return (f"has a query option redis-py does not know{option}; "
                "remove it or spell it as redis-py does (socket_timeout=5, db=0, ...)")
    except redis.RedisError as exc:
        reason = str(exc)
        if "protocol" in reason:
            return "has query option protocol with a value other than 2 or 3; use protocol=2 or protocol=3"
        return f"has a query option redis-py refuses: {scrub(reason, url)}"
    except ValueError:
        return "has a query option redis-py cannot read; check the options after '?'"
    return None
