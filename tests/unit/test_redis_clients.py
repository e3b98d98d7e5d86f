"""``stalledpolicy.controller.redis_clients``: a bad Redis URL (inline or from a
Secret) is refused in our own words, which go to status, events and logs, so
they may hold no part of the URL (urllib's error text quotes its netloc)."""

from __future__ import annotations

import base64

import pytest

from stalledpolicy.controller.redis_clients import RedisConfigError, SecretReader, resolve_url

SECRET_URL_WHERE = "the value of key 'url' in Secret ns/creds"

BAD_URLS = [
    # (url, words of the problem)
    ("redis://:s3cr/et?x#y@cache7.example:6379/0x", "'#'"),
    ("redis://:s3cr/et@cache7.example:6379/0", "%2F"),
    ("redis://:s3cret@cache7.example:6s3cret/0", "port"),
    ("redis://:s3cr\u2100et@cache7.example/0", "malformed host"),
    ("redis://:s3cret@[::1/0", "malformed host"),
    ("redis://:s3cret@cache7.example:6379/1x", "database number"),
    ("redis://:s3cret@cache7.example:6379/0?db=s3cret", "query option db"),
    ("http://:s3cret@cache7.example:6379/0", "must start with redis://"),
    ("redis://:s3cret@/0", "has no host"),
]


def _refusal(url: str, inline: bool) -> RedisConfigError:
    data = {"url": base64.b64encode(url.encode()).decode()}
    reader = SecretReader(lambda namespace, name: data if (namespace, name) == ("ns", "creds") else None, ttl=60)
    spec = {"url": url} if inline else {"secretRef": {"name": "creds", "key": "url"}}
    with pytest.raises(RedisConfigError) as caught:
        resolve_url("ns", spec, reader)
    return caught.value


@pytest.mark.parametrize(("url", "words"), BAD_URLS)
@pytest.mark.parametrize("inline", [True, False])
def test_a_bad_url_names_its_place_and_problem_and_shows_no_part_of_it(url, words, inline):
    error = _refusal(url, inline)
    assert error.reason == "InvalidRedisURL"
    where = "spec.redis.url" if inline else SECRET_URL_WHERE
    assert error.message.startswith(f"{where} ") and words in error.message
    for fragment in ("s3cr", "et@", "cache7", "x#y", "0x", "::1", "\u2100"):
        assert fragment not in error.message and fragment not in str(error), (fragment, error.message)


@pytest.mark.parametrize("url", ["redis://:pw@db:6379/0", "rediss://u:p%2Fw@db/2?socket_timeout=3"])
def test_a_good_url_from_a_secret_is_returned_as_written(url):
    assert resolve_url("ns", {"secretRef": {"name": "creds"}},
                       SecretReader(lambda namespace, name: {"url": base64.b64encode(url.encode()).decode()},
                                    ttl=60)) == url


URL = "redis://:pw@db.example:6379/0"


@pytest.mark.parametrize("stored", [URL, URL + "\n", URL + "\r\n", f"  {URL}\t\n", f"{URL}\u00a0"],
                         ids=["as-is", "newline", "crlf", "spaces-tab", "nbsp"])
def test_the_operator_digests_the_url_the_sweeper_reads(stored):
    """`kubectl create secret --from-file` keeps a file's trailing newline. The sweeper
    gets the Secret's bytes as STALLEDPOLICY_REDIS_URL (secretKeyRef) and reads the URL
    through redis_url.validation.stored_url; the operator's digest of the value, which rolls the
    sweeper's pods, is taken over the same URL: whitespace around it rolls nothing."""
    from stalledpolicy.controller.redis_clients import secret_value_digest
    from stalledpolicy.policy.builder import build_sweeper_deployment
    from stalledpolicy.policy.models import StalledPolicySpec
    from stalledpolicy.redis_url.validation import stored_url
    from stalledpolicy.sweeper.config import load_config

    spec = StalledPolicySpec.from_k8s({"queue": "q", "redis": {"secretRef": {"name": "creds"}}})
    [container] = build_sweeper_deployment("p", "ns", "uid", spec, image="i", scripts_digest="d")[
        "spec"]["template"]["spec"]["containers"]
    [url_env] = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    # what the kubelet hands the sweeper: the Secret's bytes, as they are
    read = load_config({}, {url_env["name"]: stored, "STALLEDPOLICY_QUEUE": "q"}).redis_url.get_secret_value()
    data = {"url": base64.b64encode(stored.encode()).decode()}
    resolved = resolve_url("ns", {"secretRef": {"name": "creds"}}, SecretReader(lambda ns, name: data, ttl=60))
    assert resolved == read == stored_url(stored) == URL

    def digest(url):
        return secret_value_digest("ns", "creds", "url", url, "secret-uid")

    assert digest(resolved) == digest(URL) != digest(URL.replace("db.example", "db2.example"))


@pytest.mark.parametrize("stored", ["", " ", "\n", " \t\r\n"], ids=["empty", "space", "newline", "whitespace"])
def test_a_blank_secret_value_is_secret_value_empty_not_a_missing_key(stored):
    """The key is there, its value blank: SecretKeyNotFound ('has no key') was
    wrong. Its own reason, a configuration problem (Ready's reason before a rollout
    that cannot finish: the sweeper refuses a blank URL), counted under its name."""
    from stalledpolicy.controller.metrics import REFRESH_FAILURE_REASONS
    from stalledpolicy.controller.status import CONFIGURATION_REASONS

    data = {"url": base64.b64encode(stored.encode()).decode(), "other": base64.b64encode(b"x").decode()}
    reader = SecretReader(lambda namespace, name: data, ttl=60)
    with pytest.raises(RedisConfigError) as caught:
        resolve_url("ns", {"secretRef": {"name": "creds", "key": "url"}}, reader)
    error = caught.value
    assert error.reason == "SecretValueEmpty"
    assert error.message.startswith(f"{SECRET_URL_WHERE} (spec.redis.secretRef) is empty or only whitespace; ")
    assert "has no key" not in error.message and "redis://" in error.message
    assert "SecretValueEmpty" in CONFIGURATION_REASONS and "SecretValueEmpty" in REFRESH_FAILURE_REASONS
    # a key that is absent is still SecretKeyNotFound
    with pytest.raises(RedisConfigError) as absent:
        resolve_url("ns", {"secretRef": {"name": "creds", "key": "nope"}}, reader)
    assert absent.value.reason == "SecretKeyNotFound" and "has no key 'nope'" in absent.value.message


@pytest.mark.parametrize("inline", [True, False])
def test_a_socket_url_is_refused_for_a_policy_inline_and_in_a_secret(inline):
    """No pod of a policy (sweeper or operator) mounts a socket: unix:// is refused
    in a Secret as spec.redis.url refuses it, saying why."""
    error = _refusal("unix://:s3cret@/run/redis.sock?db=1", inline)
    assert error.reason == "InvalidRedisURL"
    assert "must start with redis:// or rediss:// (TLS); unix://" in error.message
    assert "not supported for a StalledPolicy" in error.message and "s3cret" not in error.message


@pytest.mark.parametrize("url", ["redis:///0", "redis://cache7.example:99999/0", "http://cache7.example/0"])
def test_the_hint_for_spec_redis_url_is_its_own_form_and_the_secrets_has_the_password(url):
    inline = _refusal(url, inline=True).message
    assert "password@" not in inline and "[:password" not in inline, inline
    assert "redis://host[:port][/db]" in inline and "spec.redis.secretRef" in inline
    assert "redis://[:password@]host[:port][/db]" in _refusal(url, inline=False).message


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize(("url", "words"), BAD_URLS + [("unix:///run/redis.sock", "unix://")])
def test_the_event_says_what_the_condition_says(url, words, inline):
    """The condition carries the RedisConfigError's message as it is; the Event
    passes it through the URL masking: both must read the same."""
    from stalledpolicy.controller.events import build_event

    message = _refusal(url, inline).message
    event = build_event({"metadata": {"name": "p", "namespace": "ns"}}, "Warning", "InvalidRedisURL", message)
    assert event["message"] == message
    assert "<unparseable URL>" not in event["message"]


@pytest.mark.parametrize("stored", ["", "\xff\xfe"], ids=["empty", "not-utf8"])
def test_the_secret_value_messages_survive_the_event_masking(stored):
    from stalledpolicy.controller.events import build_event

    data = {"url": base64.b64encode(stored.encode("latin-1")).decode()}
    with pytest.raises(RedisConfigError) as caught:
        resolve_url("ns", {"secretRef": {"name": "creds"}}, SecretReader(lambda ns, name: data, ttl=60))
    message = caught.value.message
    assert "redis://[user:password@]host:port/db" in message
    assert build_event({"metadata": {"name": "p"}}, "Warning", caught.value.reason, message)["message"] == message
