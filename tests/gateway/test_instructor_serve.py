"""instructor (1.17.0) in TOOLS mode through a real ``tokenops serve`` on SmolLM2-135M-Instruct: it forces
a call of one function whose parameters are the pydantic model's JSON schema, then validates the
arguments into the model. The nested model's schema has ``$defs``/``$ref``, which the forced call's
grammar resolves against the tool's own parameters (a 400 "Pointer '/$defs/City' does not exist" before)."""

from __future__ import annotations

import openai
import pytest
from pydantic import BaseModel, Field

from tests.real_model import MODEL, SERVE_ENV, serve_args
from tokenops.testing_serve import ServeProcess


class City(BaseModel):
    name: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)


class Country(BaseModel):
    name: str = Field(max_length=20)
    capital: City  # a nested model: "$defs" and "$ref" in the schema


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("instructor"), args=serve_args(), env=SERVE_ENV, store=False) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)


def _extract(client, model: type[BaseModel], text: str):
    import instructor

    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    return patched.chat.completions.create(model=MODEL, response_model=model, max_retries=1, temperature=0,
                                           max_tokens=80, messages=[{"role": "user", "content": text}])


def test_instructor_tools_mode_flat_model(client):
    got = _extract(client, Person, "Extract the person: Ada Lovelace is 36 years old.")
    assert isinstance(got, Person) and got.name and 0 <= got.age <= 120


def test_instructor_tools_mode_nested_model(client):
    got = _extract(client, Country, "France: its capital is Paris, with 2 million people.")
    assert isinstance(got, Country) and isinstance(got.capital, City) and got.capital.name
