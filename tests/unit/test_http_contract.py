"""The HTTP contract (``reward_server/http/models.py``) against the proto and the neutral types, the OpenAPI
document it produces, and the one error shape for wrong JSON types (the 500s the issue-14 mutation test found)."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, get_args, get_origin

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from pydantic import BaseModel

import reward_server.types as neutral
from cer.dialogue import Turn
from reward_server.http import models
from reward_server.proto import pb
from tests.unit.test_reward_service import GOOD, HISTORY, Service, body, make_service

_SCALARS = {FieldDescriptor.TYPE_BOOL: bool, FieldDescriptor.TYPE_STRING: str, FieldDescriptor.TYPE_DOUBLE: float,
            FieldDescriptor.TYPE_UINT32: int, FieldDescriptor.TYPE_INT64: int}


def _unwrap(ann: Any) -> tuple[Any, bool]:
    """(the annotation without Annotated/None, whether None was allowed)."""
    nullable = False
    while True:
        if get_origin(ann) is Annotated:
            ann = get_args(ann)[0]
        elif get_origin(ann) in (typing.Union, types.UnionType) and type(None) in get_args(ann):
            rest = tuple(a for a in get_args(ann) if a is not type(None))
            nullable = True
            ann = rest[0] if len(rest) == 1 else typing.Union[rest]  # noqa: UP007 (a runtime union of types)
        else:
            return ann, nullable


def _enum_values(desc: EnumDescriptor) -> set[str]:
    """Proto enum names as the JSON mirror spells them (prefix dropped, lower case, UNSPECIFIED left out)."""
    prefix = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(desc.name)).upper() + "_"
    return {v.name.removeprefix(prefix).lower() for v in desc.values if not v.name.endswith("_UNSPECIFIED")}


def _json_values(ann: Any) -> set[str]:
    if get_origin(ann) is Literal:
        return set(get_args(ann))
    assert isinstance(ann, type) and issubclass(ann, enum.Enum), ann
    return {m.value for m in ann}


def _check(desc: Descriptor, model: type[BaseModel], seen: set[str]) -> None:
    """Every field of ``desc`` is a field of ``model`` and back, with the same repeated-ness and nesting."""
    seen.add(desc.name)
    assert model.__name__ == desc.name
    assert set(desc.fields_by_name) == set(model.model_fields), desc.name
    for name, f in desc.fields_by_name.items():
        where = f"{desc.name}.{name}"
        ann, _ = _unwrap(model.model_fields[name].annotation)
        repeated = f.is_repeated
        assert (get_origin(ann) is list) == repeated, f"{where}: repeated-ness differs"
        inner, nullable = _unwrap(get_args(ann)[0]) if repeated else (ann, False)
        if f.type == FieldDescriptor.TYPE_ENUM:
            assert _json_values(inner) == _enum_values(f.enum_type), where
        elif f.type != FieldDescriptor.TYPE_MESSAGE:
            assert inner is _SCALARS[f.type], where
        elif f.message_type.name == "OptionalDouble":  # JSON: a nullable number
            assert inner is float and nullable, where
        elif f.message_type.oneofs and len(f.message_type.oneofs[0].fields) == len(f.message_type.fields):
            # a oneof message (GroupOutcome): JSON has one union member per case, bare or wrapped in its case name
            members = get_args(inner)
            assert len(members) == len(f.message_type.fields), where
            for case in f.message_type.fields:
                bare = [m for m in members if m.__name__ == case.message_type.name]
                wrapped = [m for m in members if set(m.model_fields) == {case.name}]
                assert bare or wrapped, f"{where}: no JSON form of {case.name}"
                target = bare[0] if bare else _unwrap(wrapped[0].model_fields[case.name].annotation)[0]
                _check(case.message_type, target, seen)
        else:
            _check(f.message_type, inner, seen)


def test_proto_and_pydantic_models_agree_on_every_field() -> None:
    seen: set[str] = set()
    for name in ("ScoreGroupRequest", "ScoreBatchRequest", "ScoreGroupResponse", "ScoreBatchResponse",
                 "InfoResponse"):
        _check(pb.DESCRIPTOR.message_types_by_name[name], getattr(models, name), seen)
    # every proto message has its JSON model (InfoRequest: GET has no body; the two wire-only helpers)
    assert set(pb.DESCRIPTOR.message_types_by_name) - seen == {"InfoRequest", "OptionalDouble", "GroupOutcome"}
    for enum_name, values in [("Role", _json_values(models.Turn.model_fields["role"].annotation)),
                              ("Status", {s.value for s in neutral.Status})]:
        assert _enum_values(pb.DESCRIPTOR.enum_types_by_name[enum_name]) == values


@pytest.mark.parametrize("model,dataclass", [
    (models.Turn, Turn), (models.ScoreOptions, neutral.ScoreOptions), (models.ScoreGroupRequest, neutral.GroupRequest),
    (models.Error, neutral.ErrorInfo), (models.StepResult, neutral.StepResult),
    (models.PreferenceResult, neutral.PreferenceResult), (models.FormatResult, neutral.FormatResult),
    (models.Rewards, neutral.Rewards), (models.Similarity, neutral.Similarity),
    (models.CandidateResult, neutral.CandidateResult), (models.SamplingParams, neutral.SamplingInfo),
    (models.Meta, neutral.GroupMeta), (models.ScoreGroupResponse, neutral.GroupResponse),
    (models.Limits, neutral.Limits), (models.InfoResponse, neutral.InfoResponse)])
def test_models_have_the_neutral_types_fields(model: type[BaseModel], dataclass: type) -> None:
    assert set(model.model_fields) == {f.name for f in dataclasses.fields(dataclass)}


def test_score_modes_are_the_neutral_ones() -> None:
    assert set(get_args(models.ScoreMode)) == {m.value for m in neutral.SCORE_MODES}


@pytest.fixture
async def svc() -> AsyncIterator[Service]:
    async for s in make_service():
        yield s


async def test_responses_validate_against_their_models(svc: Service) -> None:
    r = await svc.http.post("/v1/score", json=body([GOOD, ""], include_judgment=True))
    assert r.status_code == 200
    parsed = models.ScoreGroupResponse.model_validate(r.json())
    assert parsed.results[1].error is not None and parsed.results[0].judgment
    batch = await svc.http.post("/v1/score:batch", json={"groups": [body([GOOD]), body([])]})
    parsed_batch = models.ScoreBatchResponse.model_validate(batch.json())
    assert isinstance(parsed_batch.groups[1], models.GroupError)
    models.InfoResponse.model_validate((await svc.http.get("/v1/info")).json())
    models.ErrorResponse.model_validate((await svc.http.post("/v1/score", json=body([]))).json())


async def test_openapi_is_the_contract_and_docs_serve(svc: Service) -> None:
    spec = (await svc.http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    for path, request, response in [("/v1/score", "ScoreGroupRequest", "ScoreGroupResponse"),
                                    ("/v1/score:batch", "ScoreBatchRequest", "ScoreBatchResponse")]:
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{request}")
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{response}")
        assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
        assert request in schemas and response in schemas
    assert set(schemas["Turn"]["properties"]) == {"role", "text"}
    assert schemas["ScoreGroupRequest"]["additionalProperties"] is False
    assert "/v1/info" in spec["paths"] and "/readyz" in spec["paths"]
    docs = await svc.http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


WRONG_TYPES = [  # (body, field): a wrong JSON type anywhere is a 422 naming the field, never a 500
    ({"history": [{"role": ["seeker"], "text": "hi"}], "reference": "r", "candidates": [GOOD]}, "history[0].role"),
    ({"history": [{"role": {"a": 1}, "text": "hi"}], "reference": "r", "candidates": [GOOD]}, "history[0].role"),
    ({"history": [{"role": "seeker", "text": ["hi"]}], "reference": "r", "candidates": [GOOD]}, "history[0].text"),
    ({"history": [["seeker", "hi"]], "reference": "r", "candidates": [GOOD]}, "history[0]"),
    ({"history": {"role": "seeker"}, "reference": "r", "candidates": [GOOD]}, "history"),
    ({"history": HISTORY, "reference": 3, "candidates": [GOOD]}, "reference"),
    ({"history": HISTORY, "reference": "r", "candidates": GOOD}, "candidates"),
    ({"history": HISTORY, "reference": "r", "candidates": [GOOD, {"x": 1}]}, "candidates[1]"),
    (body([GOOD], mode=["prm"]), "options.mode"),
    (body([GOOD], mode={"x": "prm"}), "options.mode"),
    (body([GOOD], timeout_ms="100"), "options.timeout_ms"),
    (body([GOOD], timeout_ms=1.5), "options.timeout_ms"),
    (body([GOOD], include_judgment=1), "options.include_judgment"),
    ({"history": HISTORY, "reference": "r", "candidates": [GOOD], "options": [1]}, "options"),
    ({"history": HISTORY, "reference": "r", "candidates": [GOOD], "extra": 1}, "extra"),
    ({"history": HISTORY, "reference": "r"}, "candidates"),
    # lone surrogates (JSON "\ud800") are not text: they broke the cache key's UTF-8 encoding (500)
    ({"history": [{"role": "seeker", "text": "\ud800"}], "reference": "r", "candidates": [GOOD]}, "history[0].text"),
    ({"history": HISTORY, "reference": "ok \udfff", "candidates": [GOOD]}, "reference"),
    ({"history": HISTORY, "reference": "r", "candidates": [GOOD, GOOD + "\ud800"]}, "candidates[1]"),
]


@pytest.mark.parametrize("bad,field", WRONG_TYPES)
async def test_wrong_json_type_is_422_naming_the_field(svc: Service, bad: dict[str, Any], field: str) -> None:
    r = await svc.http.post("/v1/score", content=json.dumps(bad))  # ASCII JSON: lone surrogates as \u escapes
    assert r.status_code == 422, r.text
    assert r.json() == {"error": {"code": "INVALID_ARGUMENT", "field": field, "message": r.json()["error"]["message"]}}
    batch = await svc.http.post("/v1/score:batch", content=json.dumps({"groups": [bad, body([GOOD])]}))
    assert batch.status_code == 200
    groups = batch.json()["groups"]
    assert groups[0]["error"]["field"] == f"groups[0].{field}"
    assert groups[1]["results"][0]["status"] == "ok"


@pytest.mark.parametrize("raw,field", [(b"[1, 2]", "body"), (b'"x"', "body"), (b"null", "body"),
                                       (b"[" * 100_000 + b"]" * 100_000, "body")])
async def test_non_object_bodies_are_422(svc: Service, raw: bytes, field: str) -> None:
    for path in ("/v1/score", "/v1/score:batch"):
        r = await svc.http.post(path, content=raw)
        assert r.status_code == 422 and r.json()["error"]["field"] == field


async def test_batch_envelope_errors_name_the_field(svc: Service) -> None:
    r = await svc.http.post("/v1/score:batch", json={"groups": {"a": 1}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "groups"
    r = await svc.http.post("/v1/score:batch", json={"groups": [], "group": []})
    assert r.status_code == 422 and r.json()["error"]["field"] == "group"


async def test_fastapi_validation_errors_use_the_one_shape(svc: Service) -> None:
    """A route with typed parameters (as later endpoints may declare) answers in the same shape, not FastAPI's."""
    app = svc.http._transport.app  # type: ignore[attr-defined]

    @app.post("/test-typed")
    async def typed(payload: models.ScoreOptions) -> dict[str, bool]:
        return {"ok": True}

    r = await svc.http.post("/test-typed", json={"timeout_ms": "soon"})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "timeout_ms" and r.json()["error"]["code"] == "INVALID_ARGUMENT"
    r = await svc.http.post("/test-typed", content=b"{bad")
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_ARGUMENT"


def test_field_path_format() -> None:
    from reward_server.http.convert import field_path

    assert field_path(("history", 0, "role")) == "history[0].role"
    assert field_path(("history", 0, "role"), "groups[2].") == "groups[2].history[0].role"
    assert field_path(()) == "body"


