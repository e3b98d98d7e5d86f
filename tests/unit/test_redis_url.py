"""Showing a Redis URL and keeping its secrets out of text (``stalledpolicy.redis_url``)."""

from __future__ import annotations

import pytest

from stalledpolicy.redis_url import redact_url, scrub, secrets_of


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@redis.example:6379/0", "redis://:***@redis.example:6379/0"),
    # the user goes too (the sweeper always hid it; the operator showed no userinfo at all)
    ("rediss://alice:s3cret@redis.example:6380/2", "rediss://:***@redis.example:6380/2"),
    ("redis://alice@redis.example/0", "redis://:***@redis.example/0"),
    ("rediss://:p%40ss@redis.example/0", "rediss://:***@redis.example/0"),
    # an unencoded '@' in the password: the host is what follows the last '@'
    ("redis://:p@ss@redis.example:6379/0", "redis://:***@redis.example:6379/0"),
    ("redis://redis.example:6379/0?password=s3cret&socket_timeout=5",
     "redis://redis.example:6379/0?password=***&socket_timeout=5"),
    ("redis://redis.example/0?PASSWORD=s3cret", "redis://redis.example/0?PASSWORD=***"),
    ("rediss://redis.example/0?ssl_password=s3cret&username=alice",
     "rediss://redis.example/0?ssl_password=***&username=***"),
    ("unix://:s3cret@/run/redis.sock?db=2", "unix://:***@/run/redis.sock?db=2"),
    ("redis://redis.example:6379/0", "redis://redis.example:6379/0"),
    # not a Redis scheme (shown in the error that refuses it): still redacted
    ("http://:s3cret@redis.example:6379/0", "http://:***@redis.example:6379/0"),
])
def test_redact_url_hides_user_and_password_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown


def test_an_unparseable_url_is_not_shown_at_all():
    assert redact_url("redis://:s3cret@[::1/0") == "<unparseable URL>"


@pytest.mark.parametrize(("url", "forms"), [
    ("redis://:pa%24%24word@db/0", {"pa%24%24word", "pa$$word"}),
    ("redis://db/0?password=a+b%21", {"a+b%21", "a+b!", "a b!"}),
    ("redis://user:one@db/0?ssl_password=two", {"one", "two"}),
    ("redis://user@db/0?username=alice", set()),
    ("redis://db:6379/0", set()),
    # urlsplit refuses the host, but the password beside it is still found
    ("redis://:s3cret@[::1/0?password=more", {"s3cret", "more"}),
])
def test_secrets_of_finds_every_spelling_of_every_password(url, forms):
    assert set(secrets_of(url)) == forms


def test_secrets_are_longest_first_so_none_is_half_masked():
    found = secrets_of("redis://:ab@db/0?password=ab%20cd")
    assert found == sorted(found, key=len, reverse=True)


def test_scrub_masks_the_password_as_written_and_decoded_and_redacts_the_url():
    url = "redis://alice:pa%24%24word@db.example:6379/0"
    text = scrub(f"auth failed for {url}: pa$$word / pa%24%24word rejected", url)
    assert "pa$$word" not in text and "pa%24%24word" not in text and "alice" not in text
    assert text == "auth failed for redis://:***@db.example:6379/0: *** / *** rejected"


def test_scrub_masks_a_query_password():
    url = "redis://db.example/0?password=s3cret"
    assert scrub("WRONGPASS s3cret", url) == "WRONGPASS ***"


def test_scrub_leaves_text_alone_without_a_url_or_a_password():
    assert scrub("Connection refused", None) == "Connection refused"
    assert scrub("Connection refused", "") == "Connection refused"
    assert scrub("Connection refused to db:6379", "redis://db:6379/0") == "Connection refused to db:6379"
