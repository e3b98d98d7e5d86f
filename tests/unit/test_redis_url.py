"""Showing a Redis URL and keeping its secrets out of text (``stalledpolicy.redis_url``)."""

from __future__ import annotations

import pytest

from stalledpolicy.redis_url.redaction import redact_url, scrub, secrets_of
from stalledpolicy.redis_url.validation import check_redis_url


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@redis.example:6379/0", "redis://:***@redis.example:6379/0"),
    # a user name is no secret: the part before the first ':' is shown
    ("rediss://alice:s3cret@redis.example:6380/2", "rediss://alice:***@redis.example:6380/2"),
    ("redis://alice:pa:ss@redis.example/0", "redis://alice:***@redis.example/0"),
    ("redis://app%2Dx:pw@redis.example/0", "redis://:***@redis.example/0"),  # encoded: not plain
    # without a ':' a user cannot be told from a password: all of it is masked
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
def test_redact_url_hides_the_password_shows_the_user_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown


def test_an_unparseable_url_is_not_shown_at_all():
    assert redact_url("redis://:s3cret@[::1/0") == "<unparseable URL>"


@pytest.mark.parametrize(("url", "forms"), [
    ("redis://:pa%24%24word@db/0", {"pa%24%24word", "pa$$word"}),
    ("redis://db/0?password=a+b%21", {"a+b%21", "a+b!", "a b!"}),
    ("redis://user:one@db/0?ssl_password=two", {"user:one", "one", "two"}),
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
    assert "pa$$word" not in text and "pa%24%24word" not in text
    assert text == "auth failed for redis://alice:***@db.example:6379/0: *** / *** rejected"


def test_scrub_masks_a_query_password():
    url = "redis://db.example/0?password=s3cret"
    assert scrub("WRONGPASS s3cret", url) == "WRONGPASS ***"


def test_scrub_leaves_text_alone_without_a_url_or_a_password():
    assert scrub("Connection refused", None) == "Connection refused"
    assert scrub("Connection refused", "") == "Connection refused"
    assert scrub("Connection refused to db:6379", "redis://db:6379/0") == "Connection refused to db:6379"


# -- passwords urlsplit cuts short: '/', '?' and '#' end its netloc ------------------

@pytest.mark.parametrize(("url", "shown"), [
    ("redis://user:pa/ss?#word@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://user:p@s/s?x#y:z@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://:s3cr/et@host:6379/0", "redis://:***@host:6379/0"),
    ("redis://:s3cr?et@host:6379/0?socket_timeout=5", "redis://:***@host:6379/0?socket_timeout=5"),
    ("rediss://:s3cr#et@host/2", "rediss://:***@host/2"),
    ("redis://:s3cr/et?x#y@host:6379/0x", "redis://:***@host:6379/0x"),
    # no '//': whatever comes before the last '@' may be a password
    ("user:s3cret@host:6379", "user:***@host:6379"),
    # a "user" that holds a delimiter is a guess that went wrong: masked whole
    ("redis://host/0?password=me:x@corp", "redis://:***@corp"),
    ("redis://ho/st:pw@h/0", "redis://:***@h/0"),
    ("redis://[::1]:pw@h/0", "redis://:***@h/0"),
    # a '#' ends no query value: the whole value is masked
    ("redis://host/0?password=s3c#ret&db=1", "redis://host/0?password=***&db=1"),
    # the key is read the way redis-py reads it: percent-decoded
    ("redis://host/0?pass%77ord=s3cret", "redis://host/0?pass%77ord=***"),
])
def test_redact_url_masks_up_to_the_last_at_without_parsing(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize(("url", "forms"), [
    ("redis://user:pa/ss?#word@host:6379/0", {"user:pa/ss?#word", "pa/ss?#word"}),
    ("redis://:s3cr/et?x#y@host:6379/0x", {"s3cr/et?x#y"}),
    ("redis://app:pa%2Fss@host/0", {"app:pa%2Fss", "app:pa/ss", "pa%2Fss", "pa/ss"}),
    ("redis://host/0?password=s3c#ret", {"s3c#ret"}),
    ("redis://host/0?pass%77ord=s3cret", {"s3cret"}),
])
def test_secrets_of_returns_the_whole_credential_part(url, forms):
    assert set(secrets_of(url)) == forms


def test_scrub_masks_a_password_holding_url_delimiters():
    url = "redis://user:pa/ss?#word@host:6379/0"
    text = scrub("AUTH user:pa/ss?#word failed; password pa/ss?#word; port 'pa'", url)
    assert "pa/ss" not in text and "#word" not in text
    assert text == "AUTH *** failed; password ***; port 'pa'"


# -- check_redis_url: what is wrong, in our words, without a value -------------------

@pytest.mark.parametrize("url", [
    "redis://h", "redis://h:6380", "redis://h/", "redis://:pw@h:6380/15", "rediss://user:pw@h/0",
    "redis://[::1]:6379/0", "redis://h/0/", "redis://:p%2Fa%3Fs%23s%40@h/0",
    "rediss://h/0?socket_timeout=2.5&db=3&ssl_check_hostname=false&password=a%26b",
    "redis://h/0?password=me@corp", "unix:///run/redis.sock?db=2", "unix://:pw@/run/redis.sock",
    "redis://h/2147483647?socket_timeout=0.5&socket_connect_timeout=10",
    "redis://redis.ns.svc.cluster.local./0", "redis://b\u00fccher.example/0",
    "redis://:pa,ss@h/0",  # a ',' in the password is no second host
])
def test_check_redis_url_accepts_what_redis_py_reads_as_written(url):
    assert check_redis_url(url) is None


SECRET = "s3cr"  # every bad URL below holds it, most of them in the password


@pytest.mark.parametrize(("url", "words"), [
    ("", "is empty"),
    ("http://:s3cr@h:6379/0", "must start with redis://"),
    ("REDIS://:s3cr@h/0", "must start with redis://"),
    ("s3cr@h:6379", "must start with redis://"),
    ("redis://:s3cr@/0", "has no host"),
    ("redis://:s3cr@h:99999/0", "port"),
    ("redis://:s3cr@h:0/0", "port 0"),
    ("redis://:s3cr@h:6s3cr/0", "port"),
    ("redis://:s3cr@[::1/0", "malformed host"),
    ("redis://:s3cr\u2100x@h/0", "malformed host"),
    ("redis://:s3cr@h:6379/1x", "database number"),
    # the socket layer's IDNA encoding refuses these before any lookup
    ("redis://:s3cr@redis..svc:6379/0", "malformed host: each part of a host name"),
    ("redis://:s3cr@.redis:6379/0", "malformed host"),
    ("redis://:s3cr@" + "x" * 64 + ".svc/0", "malformed host"),
    ("redis://:s3cr@h:6379/s3cr", "database number"),
    ("redis://:s3cr@h:6379/1/2", "database number"),
    ("redis://:s3cr@h:6379//", "database number"),
    ("redis://:s3cr@h/0?db=s3cr", "query option db"),
    ("redis://:s3cr@h/0?db=-1", "database number outside"),
    ("redis://:s3cr@h/0?socket_timeout=s3cr", "query option socket_timeout"),
    ("redis://:s3cr@h/0?protocol=two", "query option protocol"),
    ("unix://:s3cr@", "socket path"),
    # refused by redis-py only when it builds a connection
    ("redis://:s3cr@h/0?protocol=9", "value redis-py refuses"),
    ("rediss://:s3cr@h/0?ssl_cert_reqs=s3cr", "value redis-py refuses"),
    ("redis://:s3cr@h/0?s3cr=1", "does not know"),
    ("redis://h/0?password=hun&s3cret=x", "does not know"),
    ("redis://:s3cr@h/0?ssl_check_hostname=false", "ssl_ options need rediss://"),  # an unencoded '&' in the password
    ("unix:///run/redis.sock?s3cr=1", "does not know"),
    ("redis://:s3cr@h/0?cache_config=1", "value redis-py refuses"),        # an AttributeError in redis-py
    ("redis://:s3cr@h/0?maint_notifications_config=1", "value redis-py refuses"),
    ("redis://:s3cr@h/99999999999999999999", "database number outside"),
    ("redis://:s3cr@h/0?db=2147483648", "database number outside"),
    ("redis://:s3cr@h/0?socket_timeout=nan", "query option socket_timeout"),
    ("redis://:s3cr@h/0?socket_timeout=-1", "query option socket_timeout"),
    ("redis://:s3cr@h/0?socket_connect_timeout=0", "query option socket_connect_timeout"),
    ("redis://:s3cr@h/0?socket_timeout=inf", "query option socket_timeout"),
    # a delimiter left unencoded in the password: urlsplit (and redis-py) cut the URL there
    ("redis://:s3cr/et@h:6379/0", "%2F"),
    ("redis://:s3cr?et@h:6379/0", "%3F"),
    ("redis://:s3cr#et@h:6379/0", "%23"),
    ("redis://:s3cr/et?x#y@host:6379/0x", "%23"),
    ("redis://u:1234?s3cr@h/0", "%3F"),
    ("redis://u:s3cr@h/0#frag", "#"),
    # several nodes: redis-py reads a port "7000,b:7001" (refused as a port) or a host "a,b" (an outage)
    ("redis://:s3cr@a:7000,b:7001/0", "names several hosts"),
    ("redis://:s3cr@a,b:7001/0", "names several hosts"),
    ("redis://a,b/0", "names several hosts"),
])
def test_check_redis_url_names_the_problem_without_any_value(url, words):
    problem = check_redis_url(url)
    assert problem is not None and words in problem
    for fragment in (SECRET, "s3", "frag", "1234", "99999", "1x", "two", "::1", "\u2100"):
        assert fragment not in problem, (fragment, problem)


def test_a_port_cut_short_by_an_unencoded_password_says_to_encode():
    assert "%3F" in check_redis_url("redis://u:pa?password=x@h:6379/0")
    assert "%3F" not in check_redis_url("redis://h:99999/0")


def test_redact_urls_masks_every_url_in_a_text_and_leaves_the_rest():
    from stalledpolicy.redis_url.redaction import redact_urls

    text = "refused 'redis://u:pa/ss@h:6379/0' and rediss://:x?y@h2/1, see https://k8s.io/docs"
    shown = redact_urls(text)
    assert "pa/ss" not in shown and "x?y" not in shown
    assert shown == "refused 'redis://u:***@h:6379/0' and rediss://:***@h2/1, see https://k8s.io/docs"


@pytest.mark.parametrize("url", ['redis://:pa"ss@h:6379/0', "redis://:pa'ss@h:6379/0", "redis://u:p w@h:6379"])
def test_a_password_with_a_quote_or_a_space_is_masked_in_a_value(url):
    from stalledpolicy.redis_url.redaction import redact_value
    from stalledpolicy.tables import shown

    for text in (redact_value(url), shown(url, 200), shown(url, 12, quoted=True)):
        assert "pa" not in text and "p w" not in text and "ss@" not in text, text


def test_a_quote_in_a_password_does_not_end_the_url_in_free_text():
    from stalledpolicy.redis_url.redaction import redact_urls

    text = redact_urls('connect to redis://:pa"ss@db:6379/0 failed, and to \'redis://:x\'y@db2\'')
    assert "pa" not in text and "ss" not in text and "x'y" not in text
    assert "redis://:***@db:6379/0" in text and "@db2" in text


# -- the forms our messages teach survive the masking of Events ------------------------
# An Event's message passes redact_urls (its last line); a condition's does not. The
# hint "write redis://[:password@]host[:port][/db]" came out of it as "write
# <unparseable URL>" (the brackets), so the Event and the condition said different things.

_BAD_FOR_HINTS = ["", "http://h/0", "unix:///run/redis.sock", "redis:///0", "redis://h:99999/0",
                  "redis://:s3cr/et@h:6s3cr/0", "redis://h/0#x", "redis://h/1x", "unix://"]


@pytest.mark.parametrize("url", _BAD_FOR_HINTS)
@pytest.mark.parametrize(("unix", "credentials"), [(True, True), (False, True), (False, False)])
def test_every_problem_reads_the_same_after_the_event_masking(url, unix, credentials):
    from stalledpolicy.redis_url.redaction import redact_urls

    problem = check_redis_url(url, unix=unix, credentials=credentials)
    if problem is None:
        assert unix and url.startswith("unix:///")  # a socket, fine for the CLIs
        return
    assert redact_urls(problem) == problem
    assert "<unparseable URL>" not in redact_urls(f"spec.redis.url {problem}")


@pytest.mark.parametrize("form", [
    "redis://[:password@]host[:port][/db]", "redis://host[:port][/db]", "redis://[user:password@]host:port/db",
    "redis://user:password@host:port/db", "redis://:password@host:port/db",
])
def test_each_taught_form_is_shown_as_written_with_punctuation_after_it(form):
    from stalledpolicy.redis_url.redaction import redact_urls

    for text in (f"write {form}", f"write {form}; then", f"({form}), or", f"store the URL, {form}, under"):
        assert redact_urls(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    # a real password where the form has "password": masked
    ("write redis://[:hunter2@]host[:port][/db]", "hunter2"),
    ("redis://user:hunter2@host:port/db", "hunter2"),
    ("redis://:hunter2@host:port/db", "hunter2"),
    ("redis://[user:hunter2@]host:port/db", "hunter2"),
    # a form with anything after it but punctuation is no form
    ("redis://[:password@]host[:port][/db]?password=hunter2", "hunter2"),
    ("redis://[:password@]host[:port][/db]@db.example:hunter2@h", "hunter2"),
    ("redis://user:password@host:port/db/hunter2@h", "hunter2"),
    # the very words of a form with a real host: masked like any URL
    ("cannot reach redis://:password@db.example:6379/0", ":password@"),
    ("cannot reach redis://:s3cret@[::1/0", "s3cret"),
])
def test_masking_still_lets_no_password_through(text, secret):
    from stalledpolicy.redis_url.redaction import redact_urls

    assert secret not in redact_urls(text)


def test_the_hint_for_spec_redis_url_offers_no_password():
    """spec.redis.url refuses credentials: its hint gives its own form and names
    spec.redis.secretRef for a URL with a password."""
    for url in ("", "http://h/0", "redis:///0", "redis://h:99999/0", "unix:///run/redis.sock"):
        problem = check_redis_url(url, unix=False, credentials=False)
        assert "password@" not in problem and "[:password" not in problem, problem
        assert "redis://host[:port][/db]" in problem and "spec.redis.secretRef" in problem
    assert "percent-encode" not in check_redis_url("redis://h/0#x", credentials=False)


@pytest.mark.parametrize("url", ["unix:///run/redis.sock?db=2", "unix://:pw@/run/redis.sock"])
def test_a_socket_url_is_refused_for_a_policy_and_says_why(url):
    assert check_redis_url(url) is None  # the CLIs keep it
    problem = check_redis_url(url, unix=False)
    assert problem.startswith("must start with redis:// or rediss:// (TLS); unix://")
    assert "StalledPolicy" in problem and "pw" not in problem


def test_a_missing_database_names_the_servers_count_when_known():
    from stalledpolicy.redis_url.errors import missing_database_problem

    known = missing_database_problem("redis://:pw@h:6379/16", 16)
    assert "database 16" in known and "it has 16" in known and "0 to 15" in known and "pw" not in known
    unknown = missing_database_problem("redis://h/20")
    assert "database 20" in unknown and "16 by default" in unknown


@pytest.mark.parametrize("command", [["sweep", "--queue", "q", "--once"], ["morgue", "stats", "--queue", "q"]])
def test_a_host_with_an_empty_label_is_a_bad_setting_not_an_outage(command):
    """It was taken for a failed pass retried forever (sweep), or shown as a codec's
    own error text (morgue)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "stalledpolicy", *command, "--redis-url",
                             "redis://:s3cr@redis..svc:6379/0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "malformed host: each part of a host name between dots" in result.stderr
    assert "s3cr" not in result.stdout + result.stderr and "idna" not in result.stderr
