"""Everything we do with a Redis URL: check it, show it, keep its secrets out of text, connect to it.

A Redis URL carries the password (``redis://user:pw@host/0`` or
``?password=pw``), so the sweeper, the morgue CLI and the operator all check a
URL with ``validation.check_redis_url`` (whose messages never hold a value),
show it through ``redaction.redact_url``, pass library error text through
``redaction.scrub``, open clients with ``connecting.connect`` and say what a
server's refusal means with ``errors.refusal_in_our_words``.

This package holds no names of its own; import them from the module that holds them:

- ``validation``: checking a URL before any connection, and the URL forms our messages teach;
- ``redaction``: showing a URL and keeping its secrets out of text;
- ``connecting``: opening a plain or a cluster client (INFO, else HELLO), the no-retry policy;
- ``errors``: a refusal or a failed connection in our words (credentials, database, replica, TLS, slot migration).
"""
