"""The sweeper's settings: from flags and ``STALLEDPOLICY_*`` environment variables.

The Deployment the operator writes sets environment variables (the Redis URL
comes from a Secret that way); a person at a terminal uses flags. A flag beats
its variable. Every value is checked once, at start, and a bad one is refused
with a message that names the flag, the variable and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from stalledpolicy.durations import format_duration, parse_duration
from stalledpolicy.keyspace import InvalidLaneName, InvalidQueueName, validate_lane_name, validate_queue_name
from stalledpolicy.listen import EVERY_ADDRESS
from stalledpolicy.redis_url.redaction import redact_url, redact_value
from stalledpolicy.redis_url.validation import check_redis_url, stored_url
from stalledpolicy.tables import shown

ENV_PREFIX = "STALLEDPOLICY_"
# Limits and the batch default of the sweeper; the policy model (and through
# a unit test, the CRD) uses these.
INTERVAL_MIN_S = 1.0
INTERVAL_MAX_S = 3600.0
BATCH_MIN, BATCH_MAX = 1, 10_000
# The CRD's maximum for spec.maxStalled and a lane's maxStalled (int32).
BUDGET_MAX = 2_147_483_647
PORT_MAX = 65_535
# The batch size is the hard upper bound of one call; within it each call is
# sized to about 1 ms (engine/sizing.py), so other clients' commands wait
# about that long at most while a stall storm drains near the script's
# ceiling (bench/README.md, "Choosing the default batch").
BATCH_DEFAULT = 1000
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# A setting's number written with more characters than this (leading zeros
# too) is refused as out of range: int() refuses 4,300 digits whatever they are.
DIGITS_WRITTEN_MAX = 64
_WHOLE_NUMBER = re.compile(r"\s*([+-]?)([0-9]+)\s*")
# What a refused setting's message shows of the value given.
_VALUE_SHOWN_MAX = 64
_NUMBER_SHOWN_MAX, _NUMBER_SHOWN_KEPT = 24, 12
_INT_FIELDS = ("max_stalled", "batch_size", "metrics_port")
_BUDGET_RANGE = f"a budget must be from 0 to {BUDGET_MAX}"
REDIS_URL_DEFAULT = "redis://127.0.0.1:6379/0"
REDIS_URL_BLANK = ("is set but empty (or only whitespace); set it to the Redis URL, "
                   "redis://[:password@]host[:port][/db] (in a sweeper pod: the value of the key "
                   "spec.redis.secretRef names in the policy's Secret), or leave it unset for the "
                   f"default {REDIS_URL_DEFAULT}")


@dataclass(frozen=True)
class Setting:
    field: str
    flag: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.field.upper()

    @property
    def names(self) -> str:
        return f"{self.flag} ({self.env})"


SETTINGS: dict[str, Setting] = {
    s.field: s
    for s in (
        Setting("redis_url", "--redis-url"),
        Setting("queue", "--queue"),
        Setting("max_stalled", "--max-stalled"),
        Setting("lanes", "--lane"),
        Setting("interval", "--interval"),
        Setting("batch_size", "--batch-size"),
        Setting("metrics_port", "--metrics-port"),
        Setting("metrics_address", "--metrics-address"),
        Setting("once", "--once"),
        Setting("log_format", "--log-format"),
        Setting("log_level", "--log-level"),
    )
}


# set in the context of a message that already shows the value: no ", got ..." after it
_SHOWS_VALUE = "shows_value"


def _fail(message: str, **context: Any) -> PydanticCustomError:
    # A custom error keeps our wording as is (a plain ValueError would be
    # prefixed with "Value error, ").
    return PydanticCustomError("setting", message, context)


class NumberOutOfRange(ValueError):
    """A whole number past a maximum, judged by its digits alone (never int())."""

    def __init__(self, negative: bool):
        super().__init__("negative" if negative else "positive")
        self.negative = negative


def whole_number(text: str, maximum: int, *, written_max: int | None = None) -> int | None:
    """The whole number written in ``text`` (spaces around and a sign allowed);
    None when ``text`` is not one. A number with more digits than ``maximum``
    (or than -``maximum``), or written with more than ``written_max``
    characters, raises :class:`NumberOutOfRange` before int() sees it (int()
    refuses 4,300 digits and more with its own words). A smaller number past
    ``maximum`` is returned: the caller judges it."""
    number = _WHOLE_NUMBER.fullmatch(text)
    if number is None:
        return None
    sign, written = number.groups()
    digits = written.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or (written_max is not None and len(written) > written_max):
        raise NumberOutOfRange(negative=sign == "-")
    return int(sign + digits)


def _parse_int(value: Any, what: str, *, maximum: int, out_of_range: str, shows_value: bool = False) -> int:
    """A whole number at most ``maximum``: ``what`` says what is accepted when
    ``value`` is not a whole number, ``out_of_range`` when it is past
    ``maximum`` or too long to judge (more digits than ``maximum`` has, or
    written with more than DIGITS_WRITTEN_MAX characters, either sign). The
    lower bound is the caller's. ``shows_value``: ``out_of_range`` shows the
    value itself."""
    context = {_SHOWS_VALUE: True} if shows_value else {}
    if isinstance(value, bool):
        raise _fail(f"must be {what}")
    number: int | None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = whole_number(value, maximum, written_max=DIGITS_WRITTEN_MAX)
        except NumberOutOfRange:
            raise _fail(out_of_range, **context) from None
        if number is None:
            raise _fail(f"must be {what}")
    else:
        raise _fail(f"must be {what}")
    if number > maximum:
        raise _fail(out_of_range, **context)
    return number


class SweeperConfig(BaseModel):
    """Validated settings of one ``stalledpolicy sweep`` process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: SecretStr = SecretStr(REDIS_URL_DEFAULT)
    queue: str
    max_stalled: int = 1
    lanes: dict[str, int] = {}
    interval: float = 30.0
    batch_size: int = BATCH_DEFAULT
    metrics_port: int = 9090
    # every address: the kubelet probes the pod's IP, which is IPv6 in an IPv6-only
    # cluster (stalledpolicy.listen: IPv4 too, or only on a host without IPv6)
    metrics_address: str = EVERY_ADDRESS
    once: bool = False
    log_format: str = "text"
    log_level: str = "info"

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis_url(cls, value: Any) -> Any:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(raw, str):
            raise _fail("must be a Redis URL; write redis://[:password@]host[:port][/db]")
        url = stored_url(raw)
        if not url:
            # given, but blank: never the default in its place (a Secret key whose
            # value is empty would send the sweeper to 127.0.0.1 without a word)
            raise _fail(REDIS_URL_BLANK)
        problem = check_redis_url(url)
        if problem is not None:
            raise _fail(problem)
        return SecretStr(url)

    @field_validator("queue", mode="before")
    @classmethod
    def _queue(cls, value: Any) -> str:
        try:
            return validate_queue_name(value.strip() if isinstance(value, str) else value)
        except InvalidQueueName as exc:
            raise _fail(str(exc).removeprefix("queue: ")) from None

    @field_validator("max_stalled", mode="before")
    @classmethod
    def _max_stalled(cls, value: Any) -> int:
        budget = _parse_int(value, "a whole number >= 0 (0 = never dead-letter)", maximum=BUDGET_MAX,
                            out_of_range=f"must be from 0 to {BUDGET_MAX} (the CRD's limit for maxStalled; "
                                         "0 = never dead-letter)")
        if budget < 0:
            raise _fail("must be >= 0 (0 = never dead-letter, 1 = no recovery, 2 = one recovery, ...)")
        return budget

    @field_validator("lanes", mode="before")
    @classmethod
    def _lanes(cls, value: Any) -> dict[str, int]:
        if isinstance(value, Mapping):
            items = list(value.items())
        elif isinstance(value, str):
            items = [_split_lane(entry) for entry in value.split(",") if entry.strip()]
        else:
            items = [_split_lane(entry) for entry in value]
        lanes: dict[str, int] = {}
        for name, budget in items:
            name = name.strip() if isinstance(name, str) else name
            if not isinstance(name, str) or not name:
                raise _fail("has a lane with an empty name; write NAME=BUDGET, for example imports=1")
            try:
                # the keyspace's rule, the one place for it (the queue's rule and no ',' or '=';
                # no whitespace, separator, control character or undecodable byte)
                validate_lane_name(name)
            except InvalidLaneName as exc:
                raise _fail(str(exc).removeprefix("lane: "), **{_SHOWS_VALUE: True}) from None
            if name in lanes:
                raise _fail(f"lane {name!r} is given twice; give each lane one budget")
            number = _parse_int(
                budget, f"NAME=BUDGET with a whole-number budget >= 0 (lane {name!r})", maximum=BUDGET_MAX,
                out_of_range=(f"lane {name!r} has budget {_shown_number(budget)}; {_BUDGET_RANGE} "
                              "(the CRD's limit for a lane's maxStalled)"), shows_value=True)
            if number < 0:
                raise _fail(f"lane {name!r} has budget {number}; a budget must be >= 0 (0 = never dead-letter)")
            lanes[name] = number
        return lanes

    @field_validator("interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> float:
        if isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except ValueError:
                raise _fail("must be a duration such as 30s, 2m or 1h") from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise _fail("must be a duration such as 30s, 2m or 1h")
        if not INTERVAL_MIN_S <= seconds <= INTERVAL_MAX_S:
            raise _fail(
                f"must be between {format_duration(INTERVAL_MIN_S)} and "
                f"{format_duration(INTERVAL_MAX_S)}, for example 30s"
            )
        return seconds

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> int:
        out_of_range = f"must be from {BATCH_MIN} to {BATCH_MAX} (default {BATCH_DEFAULT})"
        size = _parse_int(value, f"a whole number from {BATCH_MIN} to {BATCH_MAX}", maximum=BATCH_MAX,
                          out_of_range=out_of_range)
        if size < BATCH_MIN:
            raise _fail(out_of_range)
        return size

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _metrics_port(cls, value: Any) -> int:
        rule = f"a port number from 1 to {PORT_MAX}, or 0 to disable the metrics server"
        port = _parse_int(value, rule, maximum=PORT_MAX, out_of_range=f"must be {rule}")
        if port < 0:
            raise _fail(f"must be {rule}")
        return port

    @field_validator("metrics_address", mode="before")
    @classmethod
    def _metrics_address(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
            raise _fail("must be an address to listen on, such as 0.0.0.0 or 127.0.0.1")
        return value.strip()

    @field_validator("once", mode="before")
    @classmethod
    def _once(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise _fail("must be true or false")

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format(cls, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in LOG_FORMATS:
            raise _fail("must be text or json")
        return text

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in LOG_LEVELS:
            raise _fail("must be one of " + ", ".join(LOG_LEVELS))
        return text

    @property
    def redis_url_redacted(self) -> str:
        return redact_url(self.redis_url.get_secret_value())

    def describe(self) -> dict[str, Any]:
        """The settings as log fields: the password stays out."""
        return {
            "queue": self.queue,
            "redis": self.redis_url_redacted,
            "max_stalled": self.max_stalled,
            "lanes": ",".join(f"{k}={v}" for k, v in self.lanes.items()) or "-",
            "interval": format_duration(self.interval),
            "batch_size": self.batch_size,
            "metrics_port": self.metrics_port,
        }


def _shown_number(value: Any) -> str:
    return shown(str(value).strip(), _NUMBER_SHOWN_MAX, keep=_NUMBER_SHOWN_KEPT)


def _split_lane(entry: Any) -> tuple[Any, Any]:
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return entry[0], entry[1]
    if isinstance(entry, str) and "=" in entry:
        name, _, budget = entry.partition("=")
        return name, budget.strip()
    # a URL put here by mistake (a Secret mapped to the wrong variable) is quoted redacted
    raise _fail(f"{redact_value(str(entry).strip())!r} is not NAME=BUDGET; write for example imports=1")


class ConfigError(Exception):
    """Bad settings; ``problems`` holds one readable line per bad setting."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _problems(error: ValidationError, given: Mapping[str, Any], sources: Mapping[str, str]) -> list[str]:
    """One line per bad setting, naming its flag and variable; ``sources``: the
    one (flag or variable) each given value came from."""
    problems = []
    for item in error.errors(include_url=False):
        field = str(item["loc"][0]) if item["loc"] else ""
        setting = SETTINGS.get(field)
        if item["type"] == "missing" and setting:
            problems.append(f"{setting.names}: is required; set {setting.flag} or {setting.env}")
            continue
        names = setting.names if setting else field or "settings"
        if field == "redis_url" and item["msg"] == REDIS_URL_BLANK:
            # set but blank: only the one that is (a blank flag beside a set variable
            # is the flag's fault; the variable is not read then)
            problems.append(f"{sources.get(field, names)}: {item['msg']}")
            continue
        if field == "redis_url":
            # Never the URL, not even redacted: a malformed one may hide its
            # password from the redaction. The message says what part is wrong.
            problems.append(f"{names}: {item['msg']}")
            continue
        if (item.get("ctx") or {}).get(_SHOWS_VALUE):
            problems.append(f"{names}: {item['msg']}")
            continue
        text = _shown(given.get(field, item.get("input")))
        if field in _INT_FIELDS and len(text) > _NUMBER_SHOWN_MAX:
            value = _shown_number(text)
        else:
            value = shown(text, _VALUE_SHOWN_MAX, quoted=not text or any(c.isspace() for c in text))
        problems.append(f"{names}: {item['msg']}, got {value}")
    return problems


def requested_log_format(flags: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """The log format asked for (flag over variable), for settings refused before
    a config exists: ``json`` only when that is what was written, else ``text``."""
    value = flags.get("log_format")
    if value is None:
        value = environ.get(SETTINGS["log_format"].env)
    return "json" if value is not None and str(value).strip().lower() == "json" else "text"


def load_config(flags: Mapping[str, Any], environ: Mapping[str, str]) -> SweeperConfig:
    """Merge flags (None = not given) over ``STALLEDPOLICY_*`` variables and validate.

    ``flags`` maps field names to parsed flag values; an empty variable counts
    as unset (a Deployment often renders optional values as ``""``), except
    STALLEDPOLICY_REDIS_URL: set but blank (a Secret key holding nothing) is
    refused, not taken for the default Redis.
    Raises :class:`ConfigError` naming every bad setting.
    """
    given: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field, setting in SETTINGS.items():
        flag_value = flags.get(field)
        if flag_value is not None and flag_value != []:
            given[field], sources[field] = flag_value, setting.flag
            continue
        env_value = environ.get(setting.env)
        if env_value is not None and (env_value.strip() != "" or field == "redis_url"):
            given[field], sources[field] = env_value, setting.env
    try:
        return SweeperConfig(**given)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, given, sources)) from None
