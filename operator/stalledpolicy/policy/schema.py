"""What the CRD says about a field, declared beside the field's model.

The models (:mod:`.models` for ``spec``, :mod:`.resource` for the object and
its ``status``) are the one source of the CRD's schema, as Go types and their
markers are for kubebuilder's controller-gen: ``hack/gen-crd.py`` turns their
pydantic JSON schema into ``crds/stalledpolicies.yaml``. The types, limits
(``Field(ge=, le=, max_length=)``), defaults and descriptions come from the
declarations themselves; what pydantic has no word for is given with
``json_schema_extra=crd(...)`` on a field, an ``Annotated`` type or a model:

- CEL rules (:class:`Rule`), the CRD's ``x-kubernetes-validations``;
- schema keywords of the CRD only (``format``, ``enum``, ``maxLength`` of a
  value the model judges otherwise, the ``x-kubernetes-*`` markers);
- ``omit``: keywords the model states but the CRD must not (a ``minLength``
  where a rule judges emptiness: the API server would report both).

A model's docstring is for Python readers and never reaches the CRD; a field's
``description`` is what ``kubectl explain`` shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VALIDATIONS = "x-kubernetes-validations"
# A marker of ours: the schema keywords hack/gen-crd.py leaves out of the CRD.
OMIT = "x-stalledpolicy-crd-omit"


@dataclass(frozen=True)
class Rule:
    """A CEL rule of the CRD: ``rule`` must hold for ``self`` (the field or
    object it is declared on), else the API server answers ``message``,
    naming ``field_path`` (relative, e.g. ``.url``) with ``reason`` if given."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def to_k8s(self) -> dict[str, str]:
        """The rule as an item of ``x-kubernetes-validations``."""
        item = {"rule": self.rule}
        if self.field_path is not None:
            item["fieldPath"] = self.field_path
        if self.reason is not None:
            item["reason"] = self.reason
        item["message"] = self.message
        return item


def crd(*rules: Rule, omit: Iterable[str] = (), **keywords: Any) -> dict[str, Any]:
    """``json_schema_extra`` giving the CRD ``rules``, schema ``keywords``
    (``format="int64"``; the ``x-kubernetes-*`` markers as ``**listed_by("name")``,
    ``**ATOMIC_LIST`` or ``**INT_OR_STRING``) and the keywords to ``omit`` from it."""
    extra: dict[str, Any] = dict(keywords)
    if rules:
        extra[VALIDATIONS] = [rule.to_k8s() for rule in rules]
    omitted = list(omit)
    if omitted:
        extra[OMIT] = omitted
    return extra


def listed_by(key: str) -> dict[str, Any]:
    """The markers of a list of objects keyed by ``key`` (each key once; server-side
    apply merges items by it): ``crd(**listed_by("name"))``."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


ATOMIC_LIST: dict[str, Any] = {"x-kubernetes-list-type": "atomic"}
INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}
