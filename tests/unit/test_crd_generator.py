"""hack/gen-crd.py: how a model's declaration becomes the CRD's schema.

That the committed CRD is current is test_generated_docs.py's; that the API
server judges with it as the models do, tests/kube/test_crd.py's.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field

from stalledpolicy.policy.schema import Rule, crd, listed_by
from tests.unit.test_generated_docs import _load


class _Item(BaseModel):
    """A docstring for Python readers only."""

    name: str = Field(description="The item's name.")


class _Declared(BaseModel):
    model_config = ConfigDict(json_schema_extra=crd(Rule("has(self.word)", "word is required", field_path=".word",
                                                         reason="FieldValueRequired"), omit=["required"]))

    word: str = Field(min_length=1, max_length=8, description="A word.",
                      json_schema_extra=crd(Rule("size(self) > 0", "word must not be empty"), omit=["minLength"]))
    count: Annotated[int, Field(ge=0)] | None = Field(default=None, description="A count.",
                                                      json_schema_extra=crd(format="int64"))
    items: list[_Item] = Field(default_factory=list, max_length=4, description="The items.",
                               json_schema_extra=crd(**listed_by("name")))
    flag: bool = Field(default=False, description="A flag.")


def _schema(model: type[BaseModel]) -> dict:
    gen = _load("gen-crd.py")
    schema = model.model_json_schema(by_alias=True)
    return gen.structural_schema(schema, schema.pop("$defs", {}))


def test_a_declaration_becomes_a_structural_schema():
    schema = _schema(_Declared)
    assert schema == {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "has(self.word)", "fieldPath": ".word", "reason": "FieldValueRequired",
             "message": "word is required"}],
        "properties": {
            # minLength left out (omit): the rule alone judges emptiness
            "word": {"type": "string", "maxLength": 8, "description": "A word.",
                     "x-kubernetes-validations": [{"rule": "size(self) > 0", "message": "word must not be empty"}]},
            # optional: no null branch, no null default
            "count": {"type": "integer", "format": "int64", "minimum": 0, "description": "A count."},
            # the item model inlined without its docstring
            "items": {"type": "array", "maxItems": 4, "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"], "description": "The items.",
                      "items": {"type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string", "description": "The item's name."}}}},
            "flag": {"type": "boolean", "default": False, "description": "A flag."},
        },
    }
    assert list(schema["x-kubernetes-validations"][0]) == ["rule", "fieldPath", "reason", "message"]


def test_a_keyword_the_generator_does_not_place_is_refused_by_name():
    class _Pattern(BaseModel):
        code: str = Field(pattern="^[a-z]+$")

    with pytest.raises(ValueError, match="'pattern'"):
        _schema(_Pattern)
