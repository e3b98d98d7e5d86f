"""The StalledPolicy spec as pydantic models: the one source of the CRD's spec.

Each field declares what the CRD says of it, beside it: type, limits, default
and description (``Field``), CEL rules and the CRD's own keywords
(``json_schema_extra=crd(...)``, :mod:`.schema`); hack/gen-crd.py writes
crds/stalledpolicies.yaml from them (``make crd``). To change a field, edit
it here and run the generator (docs/development.md).

The API server enforces the CRD, so the validators here are a second line
(objects written before a CRD upgrade, tests, tools that build specs): they
judge as the CRD's rules do, with the same patterns and words, and report
problems the way a user wrote the field (``spec.lanes[2].maxStalled: must be
at least 0 (got -1); ...``). Where CEL and Python cannot share code (the
quantity parser, keyspace's name rules), tests compare the two judgments on
the API server and on every character.

Python attribute names are snake_case; the CRD's camelCase names are aliases
and either form is accepted (``populate_by_name``).

One rule goes further than a plain URL check: an inline ``redis.url`` may not
carry credentials (an '@' with a user or password before it, or a query option
such as ``password=``, ``ssl_password=`` or ``pass%77ord=``), because the URL
would be readable in the sweeper Deployment. Such a URL is refused with a
message pointing at ``redis.secretRef``; the CRD refuses it too. Its form is
judged as the CRD does (a port from 1 to 65535, a host, a database number as
the path: :func:`url_form_problems`); the rest of what makes a URL usable is
the operator's (``validation.check_redis_url``, Ready=False InvalidRedisURL).

Entry point: :meth:`StalledPolicySpec.from_k8s`. The sweeper's configuration
is :meth:`StalledPolicySpec.sweeper_env` (the env var names are the contract
with ``stalledpolicy sweep``; see :data:`ENV_QUEUE` and friends).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from stalledpolicy import tables
from stalledpolicy.durations import parse_duration
from stalledpolicy.keyspace import (
    LANE_NAME_MAX,
    QUEUE_NAME_MAX,
    InvalidLaneName,
    InvalidQueueName,
    validate_lane_name,
    validate_queue_name,
)
from stalledpolicy.kube_names import DNS_SUBDOMAIN, QUALIFIED_NAME
from stalledpolicy.policy.schema import ATOMIC_LIST, INT_OR_STRING, Rule, crd, listed_by
from stalledpolicy.sweeper.config import BATCH_DEFAULT, BUDGET_MAX, SETTINGS
from stalledpolicy.sweeper.config import BATCH_MAX as BATCH_SIZE_MAX
from stalledpolicy.sweeper.config import BATCH_MIN as BATCH_SIZE_MIN
from stalledpolicy.sweeper.config import INTERVAL_MAX_S as SWEEP_INTERVAL_MAX_S
from stalledpolicy.sweeper.config import INTERVAL_MIN_S as SWEEP_INTERVAL_MIN_S

# --- the contract with `stalledpolicy sweep` (env var names) ---------------
ENV_QUEUE = SETTINGS["queue"].env
ENV_MAX_STALLED = SETTINGS["max_stalled"].env
ENV_LANES = SETTINGS["lanes"].env  # "imports=1,billing=0"; absent when no lane is listed
ENV_INTERVAL = SETTINGS["interval"].env  # as the user wrote it, e.g. "30s"
ENV_BATCH_SIZE = SETTINGS["batch_size"].env
ENV_METRICS_PORT = SETTINGS["metrics_port"].env
ENV_LOG_FORMAT = SETTINGS["log_format"].env
ENV_REDIS_URL = SETTINGS["redis_url"].env

DEFAULT_METRICS_PORT = 9090

# --- limits (hack/gen-crd.py writes them into crds/stalledpolicies.yaml) ----
MAX_LANES = 256
SWEEPER_REPLICAS_MAX = 100
SWEEPER_PULL_SECRETS_MAX = 16
# Go's duration syntax without "d" (the CRD checks bounds with CEL duration(),
# which is Go's parser); digits bounded per unit so that 32 characters never
# overflow int64 ns (at most ~500,000 h), yet every way of writing 1s to 1h fits
# (3600000ms, 3600s, 60m).
SWEEP_INTERVAL_PATTERN = (r"^([0-9]{1,10}(\.[0-9]{1,9})?ms|[0-9]{1,7}(\.[0-9]{1,9})?s|"
                          r"[0-9]{1,6}(\.[0-9]{1,9})?m|[0-9]{1,5}(\.[0-9]{1,9})?h)+$")
_SWEEP_INTERVAL = re.compile(SWEEP_INTERVAL_PATTERN)
# A resource quantity is what the CRD's CEL isQuantity() takes (the Pod API's
# own parser, resource.ParseQuantity: is_quantity mirrors it, a kube test
# compares), but for an exponent of 4 or more significant digits, refused
# before any parse (the parser computes 10 to that power: 1e99999999999 timed
# the request out and kept the API server's CPU busy after it). The CRD's
# rules are built from this very pattern (re.search, as CEL's matches()) and
# these words (_resource_list).
QUANTITY_HUGE_EXPONENT_PATTERN = r"[eE][+-]?0*[1-9][0-9]{3}"
QUANTITY_FIX = "write a number with an optional unit, for example 250m, 0.5, 1e3, 512Mi or 1Gi"
QUANTITY_NEGATIVE_FIX = "use 0 or more, for example 100m, 0.5, 128Mi or 1Gi"
REQUEST_OVER_LIMIT_FIX = "raise the limit or lower the request"
QUANTITY_MAX_LENGTH = 64  # the CRD's maxLength (it bounds the cost of its isQuantity() rules)
_DNS_SUBDOMAIN = re.compile(rf"^{DNS_SUBDOMAIN}$")  # anchored: CEL matches() searches; the length: max_length
DNS_SUBDOMAIN_WORDS = "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
SECRET_KEY_WORDS = "letters, digits, '-', '_' and '.', neither '.' nor starting with '..'"
QUEUE_GIVE = "give the EchoMQ queue name (the q in emq:{q}:pending)"
# Label keys and values as the Pod API judges them (nodeSelector, tolerations; the
# CRD's rules are built from these very patterns).
LABEL_KEY_PATTERN = rf"^({DNS_SUBDOMAIN}/)?{QUALIFIED_NAME}$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_KEY_WORDS = ("an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', "
                   "starting and ending with a letter or digit")
LABEL_VALUE_WORDS = ("an empty one, or up to 63 letters, digits, '-', '_' or '.', starting and ending with a "
                     "letter or digit")
# A container's resource names: these, hugepages-<size>, or a domain-qualified name.
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
RESOURCE_NAME_PATTERNS = (r"^hugepages-.+$", rf"^{DNS_SUBDOMAIN}/{QUALIFIED_NAME}$")
RESOURCE_NAME_WORDS = ("cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified name (for example "
                       "example.com/gpu)")
# A toleration as the Pod API takes it (its operator, its effect, and the rules on how they combine).
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_KEYLESS_PROBLEM = ("a toleration without a key tolerates every taint and needs operator Exists; "
                              "set operator: Exists, or give the taint's key")
TOLERATION_EXISTS_VALUE_PROBLEM = ("a toleration with operator Exists matches any value; remove value, or use "
                                   "operator Equal")
TOLERATION_SECONDS_PROBLEM = ("tolerationSeconds applies to effect NoExecute only; set effect: NoExecute, "
                              "or remove tolerationSeconds")
_URL_SCHEME = re.compile(r"^rediss?://")
# No '@' anywhere, not only before the first '/', '?' or '#': a password
# holding one of those ends urlsplit's userinfo early and would slip past a
# userinfo check (redact_url likewise takes all before the last '@' for
# credentials).
URL_CREDENTIALS_MARK = "@"
URL_CREDENTIALS_WORDS = "(an '@', or a query option whose name holds 'password', 'username' or '%')"
URL_SCHEME_PROBLEM = "must start with redis:// or rediss:// (TLS)"
_ONE_REDIS_SOURCE = "redis.url (a URL without credentials) or redis.secretRef (a Secret key holding the URL)"
# A query key that is, or may decode to, a credential: redis-py reads keys
# percent-decoded (pass%77ord=) and passes password=, ssl_password=, ... to the
# connection; its own option names need no '%'. The CRD's CEL rule is built
# from this very pattern (RE2 and Python read it alike).
URL_SECRET_QUERY_KEY_PATTERN = r"[?&][^=&]*(%|(?i:password|username))"
_URL_SECRET_QUERY_KEY = re.compile(URL_SECRET_QUERY_KEY_PATTERN)
# The URL's form (port, host, database path), as the operator reads it
# (urlsplit, validation.check_redis_url), judged with the patterns the CRD's
# rules are built from (RE2 and Python read them alike): only a redis:// or
# rediss:// URL without '@' (refused above) or a tab, CR or LF (urlsplit drops
# them), and the port and host only without [brackets] (an IPv6 host is left to
# check_redis_url). Nothing check_redis_url accepts is refused (a unit test
# tries it on many URLs). re.search, as CEL's matches().
URL_FORM_JUDGED_PATTERN = r"^rediss?://"
URL_FORM_UNJUDGED_PATTERN = r"[@\t\r\n]"
_PORT = r"0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
URL_WITH_PORT_PATTERN = r"^rediss?://[^/?#:\[\]]*:[^/?#\[\]]*([/?#]|$)"
URL_PORT_PATTERN = r"^rediss?://[^/?#:\[\]]*:(" + _PORT + r")?([/?#]|$)"
URL_NO_HOST_PATTERN = r"^rediss?://(:(" + _PORT + r")?)?([/?#]|$)"
URL_DB_PATH_PATTERN = r"^rediss?://[^/?#]*(/(([0-9]|%3[0-9])+(/|%2[fF])?)?)?([?#]|$)"
INLINE_URL_EXAMPLE = "redis://redis.queues.svc:6379/0"
_URL_FORM_FIX = f"write redis://host[:port][/db] (rediss:// for TLS), for example {INLINE_URL_EXAMPLE}"
URL_PORT_PROBLEM = f"has a port that is not a number from 1 to 65535; {_URL_FORM_FIX}"
URL_NO_HOST_PROBLEM = f"has no host; {_URL_FORM_FIX}"
URL_DB_PATH_PROBLEM = ("has a path that is not a database number; write /0, /1, ... after the host "
                       f"(or no path for 0), for example {INLINE_URL_EXAMPLE}")


def url_form_problems(url: str) -> list[str]:
    """What the CRD's form rules refuse in an inline ``redis.url`` (port, host,
    database path), in their words; [] when they let it pass."""
    if not re.search(URL_FORM_JUDGED_PATTERN, url) or re.search(URL_FORM_UNJUDGED_PATTERN, url):
        return []
    problems = []
    if re.search(URL_WITH_PORT_PATTERN, url) and not re.search(URL_PORT_PATTERN, url):
        problems.append(URL_PORT_PROBLEM)
    if re.search(URL_NO_HOST_PATTERN, url):
        problems.append(URL_NO_HOST_PROBLEM)
    if not re.search(URL_DB_PATH_PATTERN, url):
        problems.append(URL_DB_PATH_PROBLEM)
    return problems


class PolicyError(ValueError):
    """A spec the operator cannot run. ``str()`` lists every problem as
    ``<field path>: <what is wrong>; <how to fix it>``; ``problems`` holds them
    as (path, message) pairs and ``field`` is the first path. Messages never
    contain a Redis URL."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.problems = list(problems)
        self.field = self.problems[0][0] if self.problems else "spec"
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.problems))


def _problem(message: str, at: tuple[Any, ...] = ()) -> PydanticCustomError:
    """A complete message (the type tells _explain() not to add a fix); ``at``
    extends the error's location below the validated field (e.g. a list index).
    A message given with ``at`` must hold no braces (pydantic formats it then)."""
    return PydanticCustomError("policy", message, {"at": at} if at else None)


# Queue and lane names: keyspace's rule (the one the sweeper and the CLIs apply;
# the CRD's rules mirror it), its message without the leading "queue: "/"lane: "
# (the field path says which).
def _check_queue(name: str) -> str:
    try:
        validate_queue_name(name)
    except InvalidQueueName as exc:
        detail = str(exc).removeprefix("queue: ")
        raise _problem(f"{detail}; use the EchoMQ queue name exactly as producers write it") from None
    return name


def _check_lane_name(name: str) -> str:
    try:
        validate_lane_name(name)
    except InvalidLaneName as exc:
        raise _problem(str(exc).removeprefix("lane: ")) from None
    return name


def _check_interval(text: str) -> str:
    if not _SWEEP_INTERVAL.fullmatch(text):
        raise _problem(
            f"{text!r} is not a duration; write a number with a unit (ms, s, m or h), "
            "for example 30s, 2m or 1m30s"
        )
    seconds = parse_duration(text)
    if not SWEEP_INTERVAL_MIN_S <= seconds <= SWEEP_INTERVAL_MAX_S:
        raise _problem(f"{text!r} is out of range; use a duration from 1s to 1h")
    return text


def _check_quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _problem(f"must be a quantity; {QUANTITY_FIX}")
    if isinstance(value, str) and len(value) > QUANTITY_MAX_LENGTH:
        raise _problem(f"must be at most {QUANTITY_MAX_LENGTH} characters (got {len(value)}); {QUANTITY_FIX}")
    if isinstance(value, str) and not is_quantity(value):
        raise _problem(f"{value!r} is not a quantity; {QUANTITY_FIX}")
    if _is_negative_quantity(value):
        # the API server would refuse the sweeper Deployment, naming its own fields
        raise _problem(f"{value!r} is negative; {QUANTITY_NEGATIVE_FIX}")
    return value


# resource.ParseQuantity's suffixes: decimal SI (power of 10) and binary SI (power of 2)
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_QUANTITY_SHAPE = re.compile(
    r"(?P<sign>[+-]?)0*(?P<num>[0-9]*)(?:\.(?P<denom>[0-9]*))?(?P<suffix>[eEinumkKMGTP]*(?:[+-]?[0-9]*))")
_INT64_MAX = 2**63 - 1


def is_quantity(text: str) -> bool:
    """What the CRD's rule admits: CEL's isQuantity() (Go's
    resource.ParseQuantity, its quirks included: ".", "-", "m" and "Ki" are
    zero, "1e1.5" is refused) without an exponent of 4 or more significant
    digits (QUANTITY_HUGE_EXPONENT_PATTERN)."""
    if re.search(QUANTITY_HUGE_EXPONENT_PATTERN, text):
        return False
    if text == "0":
        return True
    shape = _QUANTITY_SHAPE.fullmatch(text)
    if not text or shape is None:
        return False
    num, denom, suffix = shape["num"] or "0", shape["denom"] or "", shape["suffix"]
    if shape["num"] == "" and shape["denom"] is None and suffix == "":
        return True  # "+", "-", "000": all zeros (ParseQuantity stops before its suffix check)
    if suffix in _DECIMAL_SUFFIXES:
        binary, exponent = False, _DECIMAL_SUFFIXES[suffix]
    elif suffix in _BINARY_SUFFIXES:
        binary, exponent = True, _BINARY_SUFFIXES[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]) \
            and abs(int(suffix[1:])) <= _INT64_MAX:
        binary, exponent = False, int(suffix[1:])
    else:
        return False
    # ParseQuantity's int64 fast path needs no digit; the other one (inf.Dec) does.
    if not binary:
        precision, scale = 18 - len(num) - len(denom), exponent - len(denom)
    elif not denom:
        precision, scale = 15 - len(num) - int(exponent * 3 / 10) - 1, 0
    else:
        precision, scale = -1, 0
    fast_path = precision >= 0 and scale >= -9
    return fast_path or any(ch.isdigit() for ch in text[:len(text) - len(suffix)])


def quantity_value(value: int | str) -> Decimal:
    """The number a quantity stands for (``value`` is one: is_quantity), to compare
    two: ``"500m"`` is 0.5, ``"1Ki"`` 1024, ``"1e3"`` 1000."""
    if isinstance(value, int):
        return Decimal(value)
    shape = _QUANTITY_SHAPE.fullmatch(value)
    assert shape is not None  # value is a quantity
    num, denom, suffix = shape["num"] or "0", shape["denom"] or "", shape["suffix"]
    mantissa = Decimal(f"{num}.{denom}" if denom else num)
    if suffix in _BINARY_SUFFIXES:
        mantissa *= 2 ** _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        mantissa = mantissa.scaleb(_DECIMAL_SUFFIXES[suffix])
    elif suffix:
        mantissa = mantissa.scaleb(int(suffix[1:]))
    return -mantissa if shape["sign"] == "-" else mantissa


def _is_negative_quantity(value: int | str) -> bool:
    """Below zero (``-1``, ``"-0.5"``, ``"-1Gi"``); ``"-0"`` is zero. ``value`` is a quantity (is_quantity)."""
    if isinstance(value, int):
        return value < 0
    sign_and_mantissa = re.match(r"[+-]?([0-9]*\.?[0-9]*)", value)
    assert sign_and_mantissa is not None  # the pattern matches any text (all optional)
    mantissa = sign_and_mantissa.group(1)
    return value.startswith("-") and any(digit in "123456789" for digit in mantissa)


def _check_priority_class_name(value: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(value):
        raise _problem(f"{tables.shown(value, 78, quoted=True, keep=70)} is not a PriorityClass name; use "
                       f"{DNS_SUBDOMAIN_WORDS}")
    return value


# --- the declarations: the models' fields are the CRD's (hack/gen-crd.py) ---
#
# Where the CRD judges a value by rules only (no minLength or pattern beside
# them, omit=["minLength"] where the model has one): the API server reports a
# schema keyword and a rule that refuse the same value as two errors, and a
# keyword's error keeps it from evaluating any rule. Each rule refuses one
# thing, so each bad value gets one message.

_MATCHES_DNS_SUBDOMAIN = f'self.matches(r"{_DNS_SUBDOMAIN.pattern}")'

QueueName = Annotated[str, AfterValidator(_check_queue)]
LaneName = Annotated[str, AfterValidator(_check_lane_name)]
Budget = Annotated[int, Field(ge=0, le=BUDGET_MAX)]
# The CRD's value schema of a quantity is the resource list's (_resource_list).
Quantity = Annotated[Any, AfterValidator(_check_quantity)]


class _Model(BaseModel):
    # strict: "3" is not 3 and true is not 1, as in the API server's schema.
    # Unknown fields are ignored: the API server prunes them anyway.
    model_config = ConfigDict(
        strict=True, populate_by_name=True, frozen=True, extra="ignore", validate_default=True
    )


class LanePolicy(_Model):
    """One lane (EchoMQ group) of the queue; ``max_stalled`` None = the policy's budget."""

    name: LaneName = Field(
        description="The lane (EchoMQ group) name, as workers enqueue it (the g in emq:{q}:g:<g>:pending). "
                    "No '{', '}', ':', ',', '=' or whitespace.",
        # keyspace.validate_lane_name's rule (tests/unit/test_keyspace.py spells both out)
        json_schema_extra=crd(
            Rule("size(self) > 0", "lane name must not be empty; give the lane (EchoMQ group) name"),
            Rule(r'self.matches(r"^[^{}:,=\s\p{Z}\p{Cc}]*$")',
                 "lane name must not contain '{', '}', ':', ',', '=' or whitespace"),
            maxLength=LANE_NAME_MAX,
        ),
    )
    max_stalled: Budget | None = Field(
        default=None, alias="maxStalled",
        description="This lane's stall budget, overriding spec.maxStalled for its jobs; same meaning (0 = never "
                    "dead-letter, 1 = dead-letter on the first stall, n = n-1 recoveries). Omitted: spec.maxStalled.",
    )


def _check_secret_name(value: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(value):
        raise _problem(f"{tables.shown(value, 78, quoted=True, keep=70)} is not a Secret name; use "
                       f"{DNS_SUBDOMAIN_WORDS}")
    return value


SecretName = Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_check_secret_name)]


def _secret_name_field(shown_as: str) -> Any:
    """A ``name: SecretName`` field, its CRD rule's message naming it ``shown_as``."""
    return Field(
        description="The Secret's name (in the policy's namespace).",
        json_schema_extra=crd(Rule(_MATCHES_DNS_SUBDOMAIN, f"{shown_as} must be a Secret name: {DNS_SUBDOMAIN_WORDS}"),
                              omit=["minLength"]),
    )


class SecretKeyRef(_Model):
    """A key of a Secret (in the policy's namespace) holding the Redis URL."""

    name: SecretName = _secret_name_field("redis.secretRef.name")
    key: str = Field(
        default="url", min_length=1, max_length=253,
        description="The key in the Secret's data holding the URL. Default url.",
        json_schema_extra=crd(
            Rule(f'self.matches(r"{_SECRET_KEY.pattern}") && self != "." && !self.startsWith("..")',
                 f"redis.secretRef.key must be a Secret key: {SECRET_KEY_WORDS}"),
            omit=["minLength"],
        ),
    )

    @field_validator("key")
    @classmethod
    def _secret_key(cls, value: str) -> str:
        if not _SECRET_KEY.fullmatch(value) or value == "." or value.startswith(".."):
            raise _problem(f"{value!r} is not a Secret key; use {SECRET_KEY_WORDS}")
        return value


# The url's rules are the object's, not the url's own, so that a refusal names
# spec.redis.url (fieldPath) without echoing its value (a password). The form
# rules judge as url_form_problems does, in its words.
_URL_FORM_GUARD = (f'!has(self.url) || !self.url.matches(r"{URL_FORM_JUDGED_PATTERN}") || '
                   f'self.url.matches(r"{URL_FORM_UNJUDGED_PATTERN}") || ')
_REDIS_SOURCE_RULES = (
    Rule("has(self.url) != has(self.secretRef)", f"set exactly one of {_ONE_REDIS_SOURCE}"),
    Rule('!has(self.url) || self.url.startsWith("redis://") || self.url.startsWith("rediss://")',
         f"redis.url {URL_SCHEME_PROBLEM}", field_path=".url"),
    Rule(f'!has(self.url) || (!self.url.contains("{URL_CREDENTIALS_MARK}") && '
         f'!self.url.matches(r"{URL_SECRET_QUERY_KEY_PATTERN}"))',
         f"redis.url must not carry credentials {URL_CREDENTIALS_WORDS}: they would be readable in the sweeper "
         "Deployment; put the URL in a Secret and use redis.secretRef instead",
         field_path=".url", reason="FieldValueForbidden"),
    Rule(_URL_FORM_GUARD + f'!self.url.matches(r"{URL_WITH_PORT_PATTERN}") || '
         f'self.url.matches(r"{URL_PORT_PATTERN}")', f"redis.url {URL_PORT_PROBLEM}", field_path=".url"),
    Rule(_URL_FORM_GUARD + f'!self.url.matches(r"{URL_NO_HOST_PATTERN}")', f"redis.url {URL_NO_HOST_PROBLEM}",
         field_path=".url"),
    Rule(_URL_FORM_GUARD + f'self.url.matches(r"{URL_DB_PATH_PATTERN}")', f"redis.url {URL_DB_PATH_PROBLEM}",
         field_path=".url"),
)


class RedisSource(_Model):
    """Exactly one of ``url`` (no credentials) or ``secret_ref``."""

    model_config = ConfigDict(json_schema_extra=crd(*_REDIS_SOURCE_RULES))

    url: str | None = Field(
        default=None, min_length=1, max_length=2048,
        description="The Redis URL, redis://host:port/db or rediss://host:port/db for TLS, without credentials "
                    "(a URL with an '@' or a password query option is refused: put it in a Secret and use "
                    "secretRef). A port, if given, is 1 to 65535; a path, if any, is the database number "
                    "(/0, /1, ...).",
        # "" is refused by the redis:// rule, once
        json_schema_extra=crd(omit=["minLength"]),
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None, alias="secretRef",
        description="A key of a Secret in the policy's namespace whose value is the Redis URL, credentials and "
                    "TLS included (rediss://user:password@host:6380/0): redis:// or rediss://, never unix:// (no "
                    "pod of the policy mounts a socket).",
    )

    @field_validator("url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        # Never echo the URL: it may hold a password.
        if value is None:
            return value
        if not _URL_SCHEME.match(value):
            raise _problem(URL_SCHEME_PROBLEM)
        if URL_CREDENTIALS_MARK in value or _URL_SECRET_QUERY_KEY.search(value):
            raise _problem(
                f"carries credentials {URL_CREDENTIALS_WORDS}, which would be readable in the sweeper Deployment; "
                "put the URL in a Secret and use spec.redis.secretRef instead"
            )
        problems = url_form_problems(value)
        if problems:
            raise _problem("; and ".join(problems))
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> RedisSource:
        if (self.url is None) == (self.secret_ref is None):
            raise _problem(f"set exactly one of {_ONE_REDIS_SOURCE}")
        return self


class PullSecret(_Model):
    """An image pull Secret of the sweeper pods (a LocalObjectReference, as in a Pod spec)."""

    name: SecretName = _secret_name_field("imagePullSecrets name")

    def to_k8s(self) -> dict[str, Any]:
        return {"name": self.name}


# The Pod API's rules on a toleration: the sweeper Deployment would be refused after admission.
_TOLERATION_RULES = (
    Rule(f'!has(self.key) || self.key == "" || self.key.matches(r"{LABEL_KEY_PATTERN}")',
         f"toleration key must be a label key: {LABEL_KEY_WORDS}", field_path=".key"),
    Rule(f'!has(self.value) || self.value.matches(r"{LABEL_VALUE_PATTERN}")',
         "toleration value must be a label value: empty, or up to 63 letters, digits, '-', '_' or '.', starting "
         "and ending with a letter or digit", field_path=".value"),
    Rule('(has(self.key) && self.key != "") || (has(self.operator) && self.operator == "Exists")',
         TOLERATION_KEYLESS_PROBLEM, field_path=".operator"),
    Rule('!has(self.operator) || self.operator != "Exists" || !has(self.value) || self.value == ""',
         TOLERATION_EXISTS_VALUE_PROBLEM, field_path=".value"),
    Rule('!has(self.tolerationSeconds) || (has(self.effect) && self.effect == "NoExecute")',
         TOLERATION_SECONDS_PROBLEM, field_path=".tolerationSeconds"),
)


class Toleration(_Model):
    model_config = ConfigDict(json_schema_extra=crd(*_TOLERATION_RULES))

    key: str | None = Field(
        default=None, max_length=316,
        description="The taint key to tolerate; empty with operator Exists tolerates every taint.",
    )
    operator: str | None = Field(default=None, description="Exists or Equal (default Equal).",
                                 json_schema_extra=crd(enum=list(TOLERATION_OPERATORS)))
    value: str | None = Field(default=None, max_length=63, description="The taint value to match (operator Equal).")
    effect: str | None = Field(default=None, description="The taint effect to match; empty matches all.",
                               json_schema_extra=crd(enum=list(TAINT_EFFECTS)))
    toleration_seconds: int | None = Field(
        default=None, alias="tolerationSeconds",
        description="For NoExecute, how long the pod stays bound after the taint appears.",
        json_schema_extra=crd(format="int64"),
    )

    @field_validator("operator")
    @classmethod
    def _operator(cls, value: str | None) -> str | None:
        if value is not None and value not in TOLERATION_OPERATORS:
            raise _problem(f"{value!r} is not a toleration operator; use Exists or Equal")
        return value

    @field_validator("effect")
    @classmethod
    def _effect(cls, value: str | None) -> str | None:
        if value is not None and value not in TAINT_EFFECTS:
            raise _problem(
                f"{value!r} is not a taint effect; use NoSchedule, PreferNoSchedule or NoExecute"
            )
        return value

    @field_validator("key")
    @classmethod
    def _label_key(cls, value: str | None) -> str | None:
        if value and not re.fullmatch(LABEL_KEY_PATTERN, value):
            raise _problem(f"{tables.shown(value, 78, quoted=True, keep=70)} is not a label key; "
                           f"use {LABEL_KEY_WORDS}")
        return value

    @field_validator("value")
    @classmethod
    def _label_value(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(LABEL_VALUE_PATTERN, value):
            raise _problem(f"{value!r} is not a label value; use {LABEL_VALUE_WORDS}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise _problem(TOLERATION_KEYLESS_PROBLEM, at=("operator",))
        if self.operator == "Exists" and self.value:
            raise _problem(TOLERATION_EXISTS_VALUE_PROBLEM, at=("value",))
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise _problem(TOLERATION_SECONDS_PROBLEM, at=("tolerationSeconds",))
        return self

    def to_k8s(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def _check_resource_names(quantities: dict[str, Any]) -> dict[str, Any]:
    for name in quantities:
        if name not in RESOURCE_NAMES and not any(re.fullmatch(p, name) for p in RESOURCE_NAME_PATTERNS):
            raise _problem(f"{tables.shown(name, 78, quoted=True, keep=70)} is not a resource name; use "
                           f"{RESOURCE_NAME_WORDS}")
    return quantities


ResourceList = Annotated[dict[str, Quantity], Field(max_length=16), AfterValidator(_check_resource_names)]


def _cel_is_quantity(value: str) -> str:
    """CEL: the int-or-string ``value`` is a quantity (_check_quantity's first test, as the CRD words it)."""
    return (f'(type({value}) == int || (!{value}.matches(r"{QUANTITY_HUGE_EXPONENT_PATTERN}") && '
            f"isQuantity({value})))")


def _cel_quantity(value: str) -> str:
    """CEL: the quantity ``value`` (an int or a string that is one), to compare."""
    return f"(type({value}) == int ? quantity(string({value})) : quantity({value}))"


def _resource_list(field: str) -> dict[str, Any]:
    """The CRD of ``sweeper.resources.<field>``: resource names as the Pod API
    takes them; each value an int or a string holding a quantity (_check_quantity).

    No pattern beside the value's rules (one message per bad value).
    isQuantity() is the Pod API's own parser (resource.ParseQuantity;
    is_quantity mirrors it, a kube test compares on the API server). An exponent
    of 4 or more digits (1e99999999999) is refused before any parse: the parser
    computes 10 to that power, the request timed out and the API server's CPU
    stayed busy after it; quantity() is never reached for a value the first rule
    refuses. maxLength bounds the cost of isQuantity() and quantity() (a string
    is parsed whole)."""
    known = ", ".join(f'"{name}"' for name in RESOURCE_NAMES)
    patterns = " || ".join(f'k.matches(r"{pattern}")' for pattern in RESOURCE_NAME_PATTERNS)
    huge = f'self.matches(r"{QUANTITY_HUGE_EXPONENT_PATTERN}")'
    value = crd(
        Rule(f"type(self) == int || (!{huge} && isQuantity(self))",
             f"sweeper.resources.{field} must hold quantities; {QUANTITY_FIX}"),
        Rule(f"type(self) == int ? self >= 0 : "
             f'({huge} || !isQuantity(self) || !quantity(self).isLessThan(quantity("0")))',
             f"sweeper.resources.{field} must not be negative; {QUANTITY_NEGATIVE_FIX}"),
        anyOf=[{"type": "integer"}, {"type": "string"}], maxLength=QUANTITY_MAX_LENGTH, **INT_OR_STRING,
    )
    return crd(
        Rule(f"self.all(k, k in [{known}] || {patterns})",
             f"sweeper.resources.{field} names a resource that is none of {RESOURCE_NAME_WORDS}"),
        additionalProperties=value,
    )


def _requests_within_limits_rule() -> Rule:
    """The Pod API's rule on a request above its limit (the sweeper Deployment
    would be refused after admission); values the value rules refuse are theirs."""
    request, limit = "self.requests[k]", "self.limits[k]"
    return Rule(
        f"!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
        f"!{_cel_is_quantity(request)} || !{_cel_is_quantity(limit)} || "
        f"{_cel_quantity(request)}.compareTo({_cel_quantity(limit)}) <= 0)",
        "sweeper.resources.requests must not exceed sweeper.resources.limits for the same resource; "
        f"{REQUEST_OVER_LIMIT_FIX}",
        field_path=".requests",
    )


class Resources(_Model):
    model_config = ConfigDict(json_schema_extra=crd(_requests_within_limits_rule()))

    limits: ResourceList = Field(
        default_factory=dict,
        description="The most compute resources allowed, by resource name (cpu, memory, ...).",
        json_schema_extra=_resource_list("limits"),
    )
    requests: ResourceList = Field(
        default_factory=dict,
        description="The compute resources asked for, by resource name (cpu, memory, ...).",
        json_schema_extra=_resource_list("requests"),
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for name, request in self.requests.items():
            if name in self.limits and quantity_value(request) > quantity_value(self.limits[name]):
                raise _problem(f"the request {request} of {name} exceeds its limit {self.limits[name]}; "
                               f"{REQUEST_OVER_LIMIT_FIX}", at=("requests", name))
        return self

    def to_k8s(self) -> dict[str, Any]:
        return {k: dict(v) for k, v in (("limits", self.limits), ("requests", self.requests)) if v}


def _listed_once(items: list[Any], noun: str, field: str) -> list[Any]:
    """``items`` (each with a ``name``) when no name repeats; else the problem at the repeat."""
    first_at: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.name in first_at:
            raise _problem(f"{noun} {item.name!r} is already listed at {field}[{first_at[item.name]}]; "
                           f"list each {noun} once", at=(index, "name"))
        first_at[item.name] = index
    return items


# A node label value: the CRD caps its length (the cost of its rule); the model judges it by LABEL_VALUE_PATTERN.
NodeLabelValue = Annotated[str, Field(json_schema_extra=crd(maxLength=253))]


class SweeperOverrides(_Model):
    """``spec.sweeper``: how to run the sweeper Deployment. None = the operator's default."""

    image: str | None = Field(
        default=None, min_length=1, max_length=1024,
        description="The sweeper's container image. Default: the operator's own image (one image runs both). "
                    "Any other image must be on the operator's allowlist (chart value sweeperAllowedImages), else "
                    "the policy is refused (Ready=False, InvalidSpec): the sweeper gets the Redis Secret.",
    )
    replicas: int = Field(
        default=1, ge=0, le=SWEEPER_REPLICAS_MAX,
        description="Sweeper replicas (default 1). Sweep calls are atomic, so extra replicas are safe and only "
                    "add availability. suspend: true overrides this with 0.",
    )
    resources: Resources | None = Field(
        default=None,
        description="Compute resources of the sweeper container (requests and limits, as in a Pod spec). Given, "
                    "it replaces the whole default (requests cpu 10m, memory 64Mi; limit memory 256Mi): list every "
                    "request and limit the sweeper should have. A fraction is written quoted (\"0.5\") or with a "
                    "unit (500m): the schema takes an integer or a string.",
    )
    node_selector: dict[str, NodeLabelValue] = Field(
        default_factory=dict, alias="nodeSelector", max_length=64,
        description="Node labels the sweeper pods must be scheduled on, as in a Pod spec.",
        json_schema_extra=crd(
            Rule(f'self.all(k, k.matches(r"{LABEL_KEY_PATTERN}"))',
                 f"sweeper.nodeSelector keys must be label keys: {LABEL_KEY_WORDS}"),
            Rule(f'self.all(k, self[k].matches(r"{LABEL_VALUE_PATTERN}"))',
                 "sweeper.nodeSelector values must be label values: empty, or up to 63 letters, digits, '-', '_' "
                 "or '.', starting and ending with a letter or digit"),
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64,
        description="Tolerations of the sweeper pods, as in a Pod spec.",
        json_schema_extra=crd(**ATOMIC_LIST),
    )
    priority_class_name: Annotated[str, AfterValidator(_check_priority_class_name)] | None = Field(
        default=None, alias="priorityClassName", min_length=1, max_length=253,
        description="The PriorityClass of the sweeper pods: the name of one (a DNS subdomain, lowercase letters, "
                    "digits, '-' and '.').",
        json_schema_extra=crd(Rule(_MATCHES_DNS_SUBDOMAIN,
                                   f"sweeper.priorityClassName must be a PriorityClass name: {DNS_SUBDOMAIN_WORDS}"),
                              omit=["minLength"]),
    )
    image_pull_secrets: list[PullSecret] = Field(
        default_factory=list, alias="imagePullSecrets", max_length=SWEEPER_PULL_SECRETS_MAX,
        description="Secrets in the policy's namespace (of type kubernetes.io/dockerconfigjson) the kubelet uses "
                    "to pull the sweeper's image from a private registry, each at most once, as in a Pod spec. "
                    "Omitted: none (the chart's imagePullSecrets value applies to the operator's own pod only).",
        json_schema_extra=crd(**listed_by("name")),
    )

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_pull_secrets(cls, secrets: list[PullSecret]) -> list[PullSecret]:
        return _listed_once(secrets, "Secret", "imagePullSecrets")

    @field_validator("node_selector")
    @classmethod
    def _node_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not re.fullmatch(LABEL_KEY_PATTERN, key):
                raise _problem(f"{tables.shown(key, 78, quoted=True, keep=70)} is not a label key; "
                               f"use {LABEL_KEY_WORDS}")
            if not re.fullmatch(LABEL_VALUE_PATTERN, value):
                raise _problem(f"{tables.shown(value, 78, quoted=True, keep=70)} (the value of {key}) is not a "
                               f"label value; use {LABEL_VALUE_WORDS}")
        return labels


def _go_duration(seconds: float) -> str:
    """``seconds`` as a CEL duration() literal (Go's syntax): 3600.0 -> "1h", 1.0 -> "1s"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


_INTERVAL_FORM = f'self.matches(r"{SWEEP_INTERVAL_PATTERN}")'
_INTERVAL_RANGE = (f'duration(self) >= duration("{_go_duration(SWEEP_INTERVAL_MIN_S)}") && '
                   f'duration(self) <= duration("{_go_duration(SWEEP_INTERVAL_MAX_S)}")')

# queue and redis are required by these rules, not by `required`: the schema
# keyword says only "Required value", and its error keeps the API server from
# evaluating any rule, so a spec missing both was told of the queue alone.
_SPEC_RULES = (
    Rule("has(self.queue)", f"queue is required; {QUEUE_GIVE}", field_path=".queue", reason="FieldValueRequired"),
    Rule("has(self.redis)", "redis is required; set redis.url (without credentials) or redis.secretRef {name, key}",
         field_path=".redis", reason="FieldValueRequired"),
)


class StalledPolicySpec(_Model):
    """``spec`` of a StalledPolicy. Build it with :meth:`from_k8s`."""

    model_config = ConfigDict(json_schema_extra=crd(*_SPEC_RULES, omit=["required"]))

    queue: QueueName = Field(
        description="The EchoMQ queue name (the q in emq:{q}:pending). 1 to 128 characters; '{', '}', ':' and "
                    "whitespace are not allowed, since they would break the Redis Cluster hash tag of the queue's "
                    "keys. Immutable: to sweep another queue, create a new StalledPolicy.",
        # keyspace.validate_queue_name's rule (tests/unit/test_keyspace.py spells both out)
        json_schema_extra=crd(
            Rule("size(self) > 0", f"queue must not be empty; {QUEUE_GIVE}"),
            Rule(r'self.matches(r"^[^{}:\s\p{Z}\p{Cc}]*$")',
                 "queue must not contain '{', '}', ':' or whitespace (EchoMQ keys are emq:{queue}:..., these "
                 "characters would break the hash tag)"),
            Rule("self == oldSelf", "queue is immutable; create a new StalledPolicy for another queue"),
            maxLength=QUEUE_NAME_MAX,
        ),
    )
    max_stalled: Budget = Field(
        default=1, alias="maxStalled",
        description=(
            "The stall budget. Each time a job's lease lapses and a sweep\n"
            "finds it, the job's stall count (its 'stalled' field) goes up\n"
            "by one. When the count reaches maxStalled, the job is\n"
            "dead-lettered into the queue's morgue (emq:{queue}:dead);\n"
            "below it, the job is recovered (back to pending, or to its\n"
            "lane). Default 1.\n"
            "  0: never dead-letter (stalls are still counted)\n"
            "  1: no recovery: the first stall dead-letters the job\n"
            "  2: one recovery: the second stall dead-letters it\n"
            "  3: two recoveries; n allows n-1 recoveries\n"
            "This is EchoMQ's own meaning of max_stalled, so a job's count\n"
            "means the same to workers and to the sweeper. A lane's own\n"
            "maxStalled overrides this one for its jobs."
        ),
    )
    sweep_interval: Annotated[str, AfterValidator(_check_interval)] = Field(
        default="30s", alias="sweepInterval", max_length=32,
        description="Time between two sweeps, from 1s to 1h, written as a number with a unit (ms, s, m or h), "
                    "for example 30s, 90s, 2m or 1m30s. Default 30s. Each sweep drains every lapsed lease in "
                    "bounded batches (batchSize).",
        json_schema_extra=crd(
            Rule(_INTERVAL_FORM, "sweepInterval must be a number with a unit (ms, s, m or h) from 1s to 1h, for "
                                 "example 30s, 2m or 1m30s"),
            Rule(f"!{_INTERVAL_FORM} || ({_INTERVAL_RANGE})", "sweepInterval must be from 1s to 1h"),
        ),
    )
    batch_size: int = Field(
        default=BATCH_DEFAULT, alias="batchSize", ge=BATCH_SIZE_MIN, le=BATCH_SIZE_MAX,
        description=f"The most stalled jobs one atomic sweep call handles ({BATCH_SIZE_MIN} to {BATCH_SIZE_MAX}, "
                    f"default {BATCH_DEFAULT}). Within it each call is sized to about 1 ms of work, learnt from the "
                    "calls before, so Redis never blocks long; a sweep repeats calls until no lapsed lease is left.",
    )
    lanes: list[LanePolicy] = Field(
        default_factory=list, max_length=MAX_LANES,
        description="The queue's lanes (EchoMQ fair groups) this policy names, each at most once. A lane's "
                    "maxStalled overrides the policy's for jobs of that lane; a lane without one uses the "
                    "policy's. Listed lanes also get their own numbers in status.lanes. Lanes not listed are "
                    "swept too, with the policy's budget.",
        json_schema_extra=crd(**listed_by("name")),
    )
    redis: RedisSource = Field(
        description="Required. Where the queue's Redis (or Valkey) is: exactly one of url or secretRef. A URL "
                    "with a password (or rediss:// TLS options) belongs in a Secret: it is handed to the sweeper "
                    "through secretKeyRef and never copied into the Deployment, status, events or logs.",
    )
    suspend: bool = Field(
        default=False,
        description="True stops sweeping: the sweeper Deployment is kept at zero replicas. Status is still "
                    "published. Default false.",
    )
    sweeper: SweeperOverrides = Field(
        default_factory=SweeperOverrides,
        description="Optional overrides for the sweeper Deployment the operator runs for this policy.",
    )

    @field_validator("lanes")
    @classmethod
    def _unique_lanes(cls, lanes: list[LanePolicy]) -> list[LanePolicy]:
        return _listed_once(lanes, "lane", "lanes")

    # -- construction ------------------------------------------------------

    @classmethod
    def from_k8s(cls, spec: Mapping[str, Any] | None) -> StalledPolicySpec:
        """Validate a policy's ``spec`` as the API server hands it (camelCase keys;
        any Mapping, e.g. kopf's ``spec``). Raises :class:`PolicyError` naming each
        bad field as ``spec.<path>``."""
        if not isinstance(spec, Mapping):
            raise PolicyError([("spec", "is missing; a StalledPolicy needs spec.queue and spec.redis")])
        try:
            return cls.model_validate(_plain(spec))
        except ValidationError as exc:
            # `from None`: the pydantic error repeats input values (a URL may hold a password).
            raise PolicyError([_explain(error) for error in exc.errors()]) from None

    # -- derived configuration ---------------------------------------------

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.sweep_interval)

    def lane_budgets(self) -> dict[str, int]:
        """Each listed lane's effective budget (its own, else the policy's), in spec order."""
        return {
            lane.name: self.max_stalled if lane.max_stalled is None else lane.max_stalled
            for lane in self.lanes
        }

    def lanes_env(self) -> str:
        """``STALLEDPOLICY_LANES``: ``name=budget`` pairs joined by commas (``imports=1,billing=0``)."""
        return format_lane_budgets(self.lane_budgets())

    def sweeper_env(
        self, *, metrics_port: int = DEFAULT_METRICS_PORT, log_format: str = "json"
    ) -> list[dict[str, Any]]:
        """The sweeper container's ``env``: everything ``stalledpolicy sweep`` needs.

        The Redis URL comes by ``valueFrom.secretKeyRef`` for ``redis.secretRef``;
        an inline ``redis.url`` (credential-free by validation) is a plain value.
        """
        env: list[dict[str, Any]] = [
            {"name": ENV_QUEUE, "value": self.queue},
            {"name": ENV_MAX_STALLED, "value": str(self.max_stalled)},
            {"name": ENV_INTERVAL, "value": self.sweep_interval},
            {"name": ENV_BATCH_SIZE, "value": str(self.batch_size)},
            {"name": ENV_METRICS_PORT, "value": str(metrics_port)},
            {"name": ENV_LOG_FORMAT, "value": log_format},
        ]
        if self.lanes:
            # Absent when no lane is listed (the API server drops empty values anyway).
            env.insert(2, {"name": ENV_LANES, "value": self.lanes_env()})
        if self.redis.secret_ref is not None:
            ref = self.redis.secret_ref
            env.append(
                {
                    "name": ENV_REDIS_URL,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
                }
            )
        else:
            env.append({"name": ENV_REDIS_URL, "value": self.redis.url})
        return env


def format_lane_budgets(budgets: Mapping[str, int]) -> str:
    """``{"imports": 1, "billing": 0}`` -> ``"imports=1,billing=0"``."""
    return ",".join(f"{name}={budget}" for name, budget in budgets.items())


def parse_lane_budgets(text: str) -> dict[str, int]:
    """The inverse of :func:`format_lane_budgets`, for ``stalledpolicy sweep``.
    Empty text is no lanes. Raises ValueError naming the bad pair and the form."""
    budgets: dict[str, int] = {}
    for pair in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip().isdigit():
            raise ValueError(
                f"{ENV_LANES}: {pair!r} is not name=budget; write for example imports=1,billing=0"
            )
        if name in budgets:
            raise ValueError(f"{ENV_LANES}: lane {name!r} is listed twice")
        budgets[name] = int(value)
    return budgets


# --- error reporting ------------------------------------------------------

_FIXES = {
    "queue": "use the EchoMQ queue name, 1 to 128 characters without '{', '}', ':' or whitespace",
    "maxStalled": (
        "use 0 (never dead-letter) or a budget n >= 1 (the n-th stall dead-letters the job; "
        "1 = no recovery, 2 = one recovery)"
    ),
    "sweepInterval": "write a duration from 1s to 1h with a unit, for example 30s, 2m or 1h",
    "batchSize": f"use a whole number from {BATCH_SIZE_MIN} to {BATCH_SIZE_MAX} (default {BATCH_DEFAULT})",
    "lanes": f"list at most {MAX_LANES} lanes as {{name, maxStalled}} objects",
    "name": "give the name as a string",
    "redis": "set redis.url (without credentials) or redis.secretRef {name, key}",
    "url": "write redis://host:port/db, or use redis.secretRef for a URL with a password",
    "secretRef": "give the Secret as {name, key}",
    "key": "name the Secret key holding the URL (default url)",
    "suspend": "use true or false",
    "sweeper": "give sweeper overrides as an object",
    "image": "give a container image reference",
    "replicas": f"use a whole number from 0 to {SWEEPER_REPLICAS_MAX}",
    "nodeSelector": "give node labels as a map of strings",
    "tolerations": "give tolerations as in a Pod spec",
    "priorityClassName": "name an existing PriorityClass",
    "imagePullSecrets": (
        f"list at most {SWEEPER_PULL_SECRETS_MAX} Secrets of the policy's namespace as {{name}} objects"
    ),
}
_SECRET_FIELDS = {"url"}


def _path(loc: Sequence[Any]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _describe(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    plain = {
        "missing": "is required",
        "int_type": "must be a whole number",
        "string_type": "must be a string",
        "bool_type": "must be true or false",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "list_type": "must be a list",
        "tuple_type": "must be a list",
        "string_too_short": "must not be empty",
    }
    if kind in plain:
        return plain[kind]
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} entries"
    return str(error["msg"])


def _explain(error: Mapping[str, Any]) -> tuple[str, str]:
    loc = tuple(error["loc"])
    if error["type"] == "policy":
        return _path(loc + tuple((error.get("ctx") or {}).get("at", ()))), str(error["msg"])
    path = _path(loc)
    field = next((part for part in reversed(loc) if isinstance(part, str)), "spec")
    message = _describe(error)
    given = error.get("input")
    if (
        error["type"] != "missing"
        and field not in _SECRET_FIELDS
        and isinstance(given, (int, float, str, bool))
    ):
        # redacted before it is cut or quoted: a URL in the wrong field shows no password
        got = tables.shown(given, 78, quoted=True, keep=70) if isinstance(given, str) else repr(given)
        message += f" (got {got})"
    fix = _FIXES.get(field)
    return path, f"{message}; {fix}" if fix else message


def _plain(value: Any) -> Any:
    """kopf hands Mapping views, not dicts; strict validation wants plain types."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
