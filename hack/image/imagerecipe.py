"""The image's recipe, read from the Dockerfile, so that `make image` and
`docker build` cannot drift apart.

`make image` (build.py) builds the image that the Dockerfile's final stage
describes, without a container engine:

- ``FROM debian:<suite>-slim``: a root filesystem of Debian <suite> from
  mmdebstrap (minbase);
- ``RUN apt-get ... install <packages>``: mmdebstrap's ``--include``;
- ``COPY --from=build /wheels /wheels``: the wheels, from the build stage,
  whose ``WORKDIR``, ``COPY`` and ``RUN`` lines are done likewise in a chroot of
  its own (with the network: pip fetches from PyPI there);
- every other ``RUN``: run as it is (``/bin/sh -c``) in a chroot of the root
  filesystem;
- ``USER``, ``ENV``, ``EXPOSE``, ``WORKDIR``, ``ENTRYPOINT``, ``CMD``: the
  image's config.

Anything else in the final stage is refused (``RecipeError``): the builder
would not know how to do it. Standard library only, so that it runs with any
Python 3.11.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stalledpolicy-operator"


class RecipeError(ValueError):
    """The Dockerfile says something the builder does not do."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # continuation lines joined, comments dropped
    line: int  # where it starts (1-based)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass(frozen=True)
class Recipe:
    suite: str  # Debian suite of the final stage's base (bookworm)
    packages: tuple[str, ...]  # the final stage's apt-get install list
    wheels_dir: str  # where COPY --from=build puts the wheels (/wheels)
    build_sources: tuple[tuple[tuple[str, ...], str], ...]  # the build stage's COPY (sources, destination)
    build_workdir: str  # the build stage's WORKDIR, where its COPY and RUN lines are relative to
    build_run: tuple[str, ...]  # the build stage's RUN lines (but apt-get's)
    run: tuple[str, ...]  # the final stage's other RUN commands, in order
    user: str
    env: tuple[tuple[str, str], ...]  # in order
    exposed_ports: tuple[str, ...]  # "8080/tcp"
    workdir: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def venv(self) -> str:
        """The venv that the RUN lines create (``python3 -m venv <dir>``)."""
        for command in self.run:
            match = re.search(r"python3 -m venv (\S+)", command)
            if match:
                return match.group(1)
        raise RecipeError("no RUN line of the final stage creates a venv (python3 -m venv DIR)")

    def docker_config(self) -> dict:
        """The ``config`` object of the image's config JSON."""
        return {
            "User": self.user,
            "Env": [f"{key}={value}" for key, value in self.env],
            "ExposedPorts": {port: {} for port in self.exposed_ports},
            "WorkingDir": self.workdir,
            "Entrypoint": list(self.entrypoint),
            "Cmd": list(self.cmd),
        }


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions: continuation lines joined, comment lines
    (also those inside a continued instruction) dropped."""
    result: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        raise RecipeError("the Dockerfile ends inside a continued line")
    return result


def stages(text: str) -> list[Stage]:
    found: list[Stage] = []
    for inst in instructions(text):
        if inst.keyword == "FROM":
            words = inst.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        elif not found:
            if inst.keyword != "ARG":
                raise RecipeError(f"line {inst.line}: {inst.keyword} before the first FROM")
        else:
            found[-1].instructions.append(inst)
    if not found:
        raise RecipeError("the Dockerfile has no FROM")
    return found


def _exec_form(inst: Instruction) -> tuple[str, ...]:
    try:
        value = json.loads(inst.args)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecipeError(f"line {inst.line}: {inst.keyword} must be in exec form, a JSON list of strings")
    return tuple(value)


def _env_pairs(inst: Instruction) -> list[tuple[str, str]]:
    words = shlex.split(inst.args)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return [(words[0], " ".join(words[1:]))]
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise RecipeError(f"line {inst.line}: ENV {word!r} is not KEY=VALUE")
        if "$" in value:
            raise RecipeError(f"line {inst.line}: ENV {key} refers to a variable; write the value out")
        pairs.append((key, value))
    return pairs


def _apt_packages(command: str, line: int) -> tuple[str, ...]:
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:1] == ["apt-get"] and "install" in words:
            after = words[words.index("install") + 1:]
            return tuple(w for w in after if not w.startswith("-"))
    raise RecipeError(f"line {line}: the apt-get RUN line has no apt-get install")


def _suite(base: str) -> str:
    match = re.fullmatch(r"(?:docker\.io/)?(?:library/)?debian:([a-z]+)(?:-slim)?", base)
    if not match:
        raise RecipeError(f"the final stage's base {base!r} is not debian:<suite>[-slim]")
    return match.group(1)


def parse(text: str) -> Recipe:
    all_stages = stages(text)
    final = all_stages[-1]
    build = next((s for s in all_stages[:-1] if s.name == "build"), None)
    if build is None:
        raise RecipeError("no build stage (FROM ... AS build) before the final one")
    build_sources = []
    build_run: list[str] = []
    build_packages: tuple[str, ...] = ()
    build_workdir = "/"
    for inst in build.instructions:
        if inst.keyword == "COPY":
            words = inst.args.split()
            if any(w.startswith("--") for w in words):
                raise RecipeError(f"line {inst.line}: COPY with options in the build stage")
            build_sources.append((tuple(words[:-1]), words[-1]))
        elif inst.keyword == "RUN" and "apt-get" in inst.args:
            build_packages = _apt_packages(inst.args, inst.line)
        elif inst.keyword == "RUN":
            build_run.append(inst.args)
        elif inst.keyword == "WORKDIR":
            build_workdir = inst.args
        else:
            raise RecipeError(f"line {inst.line}: hack/image does not do {inst.keyword} in the build stage")
    if _suite(build.base) != _suite(final.base):
        raise RecipeError("the build stage and the final stage must be of the same Debian suite")

    packages: tuple[str, ...] | None = None
    wheels_dir = None
    run: list[str] = []
    single: dict[str, Instruction] = {}
    env: list[tuple[str, str]] = []
    exposed: list[str] = []
    for inst in final.instructions:
        if inst.keyword == "RUN":
            if "apt-get" in inst.args:
                if packages is not None:
                    raise RecipeError(f"line {inst.line}: a second apt-get RUN line")
                packages = _apt_packages(inst.args, inst.line)
            else:
                run.append(inst.args)
        elif inst.keyword == "COPY":
            words = inst.args.split()
            if len(words) != 3 or words[0] != "--from=build" or words[1] != words[2]:
                raise RecipeError(f"line {inst.line}: the final stage may only COPY --from=build DIR DIR")
            if wheels_dir is not None:
                raise RecipeError(f"line {inst.line}: a second COPY")
            wheels_dir = words[1]
        elif inst.keyword == "ENV":
            env.extend(_env_pairs(inst))
        elif inst.keyword == "EXPOSE":
            for port in inst.args.split():
                exposed.append(port if "/" in port else f"{port}/tcp")
        elif inst.keyword in {"USER", "WORKDIR", "ENTRYPOINT", "CMD"}:
            if inst.keyword in single:
                raise RecipeError(f"line {inst.line}: a second {inst.keyword}")
            single[inst.keyword] = inst
        else:
            raise RecipeError(f"line {inst.line}: hack/image does not do {inst.keyword} in the final stage")
    missing = {"USER", "WORKDIR", "ENTRYPOINT", "CMD"} - single.keys()
    if missing:
        raise RecipeError(f"the final stage has no {', '.join(sorted(missing))}")
    if packages is None or wheels_dir is None:
        raise RecipeError("the final stage needs one apt-get install RUN line and one COPY --from=build")
    keys = [key for key, _ in env]
    if len(keys) != len(set(keys)):
        raise RecipeError("an ENV key is set twice")
    if not set(build_packages) <= set(packages):
        # the builder runs both stages on one root filesystem with the final stage's packages
        raise RecipeError(f"the build stage installs {sorted(set(build_packages) - set(packages))}, "
                          "which the final stage does not")
    return Recipe(
        suite=_suite(final.base),
        packages=packages,
        wheels_dir=wheels_dir,
        build_sources=tuple(build_sources),
        build_workdir=build_workdir,
        build_run=tuple(build_run),
        run=tuple(run),
        user=single["USER"].args,
        env=tuple(env),
        exposed_ports=tuple(exposed),
        workdir=single["WORKDIR"].args,
        entrypoint=_exec_form(single["ENTRYPOINT"]),
        cmd=_exec_form(single["CMD"]),
    )


def load(repo: Path = REPO) -> Recipe:
    return parse((repo / "Dockerfile").read_text())


def project_version(repo: Path = REPO) -> str:
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]


def chart_image(repo: Path = REPO) -> tuple[str, str]:
    """(repository, tag) of the image the chart runs by default: values.yaml's
    image.repository and, its tag being empty, Chart.yaml's appVersion. Read
    with two patterns (no YAML parser needed); the unit test checks them
    against a real YAML parse."""
    chart_dir = repo / "charts" / "stalledpolicy-operator"
    chart = (chart_dir / "Chart.yaml").read_text()
    values = (chart_dir / "values.yaml").read_text()
    app = re.search(r'^appVersion:\s*"?([^"\s#]+)"?', chart, re.M)
    image = re.search(r"^image:\n(?:[ \t]+#.*\n)*[ \t]+repository:\s*\"?([^\"\s#]+)\"?", values, re.M)
    tag = re.search(r"^image:\n(?:[ \t]+.*\n)*?[ \t]+tag:\s*\"?([^\"\s#]*)\"?", values, re.M)
    if not app or not image or not tag:
        raise RecipeError("cannot read appVersion from Chart.yaml or image.repository/tag from values.yaml")
    return image.group(1), tag.group(1) or app.group(1)


def image_reference(repo: Path = REPO) -> str:
    repository, tag = chart_image(repo)
    return f"{repository}:{tag}"
