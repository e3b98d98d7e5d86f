"""Showing a Redis URL and keeping its secrets out of text.

:func:`redact_url` shows one URL, :func:`redact_urls` every URL in text we did
not write, :func:`redact_value` a setting's value, :func:`scrub` a library's
error text with a URL's password masked in every spelling (:func:`secrets_of`).

Masking never parses the URL: urlsplit ends the userinfo at the first '/', '?'
or '#', so a password holding one of those (written unencoded, a common slip)
would be shown in part. Everything between ``//`` and the last ``@`` is taken
for the credentials instead; when in doubt we mask too much, never too little.
A user name is no secret: the part before the first ':' of the credentials is
shown when it is plain (no delimiter a password cut short would leave in it).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_plus, urlsplit

from stalledpolicy.redis_url.validation import INLINE_URL_FORM, URL_FORM

MASK = "***"
UNPARSEABLE = "<unparseable URL>"


def _is_password_key(name: str) -> bool:
    # redis-py passes every query argument to the connection: password= and
    # ssl_password= (the passphrase of the TLS key) both carry a secret.
    return "password" in name.lower()


def _is_secret_query_key(name: str) -> bool:
    return _is_password_key(name) or name.lower() == "username"


def _split_credentials(url: str) -> tuple[str, str | None, str]:
    """``(head, credentials, rest)`` without parsing: ``credentials`` is all
    between ``//`` (or the start, when there is none) and the last ``@`` of the
    whole URL, None when no '@' follows; ``head`` ends with the ``//``."""
    slashes = url.find("//")
    start = slashes + 2 if slashes >= 0 else 0
    at = url.rfind("@")
    if at < start:
        return url[:start], None, url[start:]
    return url[:start], url[start:at], url[at + 1:]


def _query_pairs(text: str) -> list[tuple[str, str | None]]:
    """``(key, value)`` of each ``&``-separated argument after the first '?' of
    ``text``, as written; a value runs to the next '&' or the end ('#' ends no
    value: a password may hold one). ``value`` is None without an '='."""
    query = text.partition("?")[2]
    pairs: list[tuple[str, str | None]] = []
    for pair in query.split("&") if query else ():
        key, equals, value = pair.partition("=")
        pairs.append((key, value if equals else None))
    return pairs


# characters a user name is shown without: a "user" holding one is a guess
# that took a query value or part of a host for the credentials
_NOT_IN_SHOWN_USER = frozenset("/?#@&=[]% \t\r\n")


def _shown_user(credentials: str) -> str:
    """The user name of ``credentials`` (``user:password``) when it is safe to
    show: the part before the first ':', when there is a ':' and that part is
    plain; else "" (everything is masked)."""
    user, colon, _ = credentials.partition(":")
    if not colon or any(char in _NOT_IN_SHOWN_USER for char in user):
        return ""
    return user


def redact_url(url: str) -> str:
    """``url`` safe to show: the credentials (all between ``//`` and the last
    ``@``) become ``user:***@`` (the user name, the part before the first
    ':', is no secret; without a ':' there is no telling a user from a
    password and all of it becomes ``:***@``) and secret query values (``password=``,
    ``username=``, ``ssl_password=``, the key read percent-decoded) become
    ``***``; scheme, host, port, database and other options stay as written.
    A URL urlsplit refuses (an unclosed '[') is not shown at all."""
    try:
        urlsplit(url)
    except ValueError:
        return UNPARSEABLE
    head, credentials, rest = _split_credentials(url)
    if credentials is not None:
        head = f"{head}{_shown_user(credentials)}:{MASK}@"
    before, question, _ = rest.partition("?")
    if not question:
        return head + rest
    query = "&".join(
        f"{key}={MASK}" if value is not None and _is_secret_query_key(unquote_plus(key))
        else key if value is None else f"{key}={value}"
        for key, value in _query_pairs(rest)
    )
    return f"{head}{before}?{query}"


def secrets_of(url: str) -> list[str]:
    """Every form a password of ``url`` may take in someone's message: the
    whole credential part (``user:password``) and the password alone, as written
    and percent-decoded, and the values of password query arguments found
    anywhere in the URL; longest first, so no form is left half-masked.
    A user without a password is no secret (it would mask common words)."""
    _, credentials, _ = _split_credentials(url)
    written = []
    if credentials is not None:
        user, colon, password = credentials.partition(":")
        if colon and password:
            written.append(password)
            if user:
                written.append(credentials)
    # the whole URL, not only what follows the last '@': a '@' in a query
    # value (?password=a@b) is no end of credentials to redis-py
    for key, value in _query_pairs(url):
        if value and _is_password_key(unquote_plus(key)):
            written.append(value)
    forms = {form for raw in written for form in (raw, unquote(raw), unquote_plus(raw)) if form}
    return sorted(forms, key=lambda form: (-len(form), form))


def scrub(text: str, url: str | None) -> str:
    """``text`` (a library's error message: not ours to trust) with ``url``
    shown redacted and any password of it masked, in every spelling."""
    if not url:
        return text
    text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text


# a URL runs to the next whitespace: a quote may be part of its password (the
# credentials end at its last '@', so a quote after the URL changes nothing)
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_URL_START = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


# Forms of a URL our own messages teach: placeholders ("password", "[:port]"),
# no one's value. redact_urls shows them as written (the brackets would make
# redact_url call them unparseable, the "@" take "[:password" for credentials).
# Only a whole match counts, give or take trailing punctuation; anything else
# that looks like one (a real password in the place of "password") is masked.
URL_FORMS = frozenset({
    URL_FORM,
    INLINE_URL_FORM,
    "redis://[:password@]host:port/db",
    "redis://[user:password@]host:port/db",
    "redis://[user:password@]host[:port][/db]",
    "redis://user:password@host:port/db",
    "redis://:password@host:port/db",
})
_AFTER_A_FORM = ".,;:)'\""


def _redact_found(url: str) -> str:
    if url.rstrip(_AFTER_A_FORM) in URL_FORMS:
        return url
    return redact_url(url)


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`), for text we
    did not write: argparse's complaints, an API server's or a library's message.
    A password holding whitespace cannot be told from the text after it: in a
    value that is a URL, :func:`redact_value` finds it. The forms of
    :data:`URL_FORMS` (placeholders our messages teach) are left as written."""
    return _URL_IN_TEXT.sub(lambda url: _redact_found(url.group(0)), text)


def holds_password(value: str) -> bool:
    """Whether ``value`` is, or quotes, a URL with a password (a user name alone,
    ``ssh://git@host``, is none: :func:`secrets_of`)."""
    urls = [value.strip()] if _URL_START.match(value) else []
    urls += [found.group(0) for found in _URL_IN_TEXT.finditer(value)]
    return any(secrets_of(url) for url in urls)


def redact_value(value: str) -> str:
    """A setting's or a field's value, to quote in a message: redacted whole when
    it is a URL (so a password holding a space is masked too), else any URL in it."""
    return redact_url(value) if _URL_START.match(value) else redact_urls(value)
