"""openai-agents in its default mode (the Responses API) against a real ``tokenops serve``
on the embedded default model (SmolLM2-135M-Instruct from the packaged GGUF): an agent
whose function tool takes a nested pydantic argument (its schema has ``$defs``/``$ref``),
run and streamed with ``Runner.run_streamed``; and ``client.responses.create`` turns
chained by ``previous_response_id`` that the model answers with the earlier turns in mind.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from tokenops.testing_serve import ServeProcess

#: Clears the suite's toy default (tests/conftest.py): serve runs what a new user gets.
REAL_DEFAULT_ENV = {"TOKENOPS_DEFAULT_MODEL": ""}
#: Greedy decoding: the 135M model confirms this order in a few words (others can ramble past max_tokens).
QUESTION = "Please order 2 apples to Paris, France."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("agents")
    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path

    if smollm2_path() is None:
        pytest.skip(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    with ServeProcess(tmp_path_factory.mktemp("agents"), env=REAL_DEFAULT_ENV, store=False) as srv:
        yield srv


class Address(BaseModel):
    city: str
    country: str


class Order(BaseModel):
    item: str
    quantity: int
    ship_to: Address


@pytest.fixture(scope="module")
def shop(server):
    import openai
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export to OpenAI
    model = openai.OpenAI(base_url=server.base_url, api_key="unused").models.list().data[0].id
    orders: list[Order] = []

    @function_tool
    def place_order(order: Order) -> str:
        """Place an order for an item, shipped to an address."""
        orders.append(order)
        return f"Order placed: {order.quantity} x {order.item} to {order.ship_to.city}."

    # tool_choice "required" forces the first turn to call the tool (grammar-constrained); the SDK
    # resets it after the call, so the model answers the tool's output in text
    agent = Agent(name="shop", model=model, tools=[place_order],
                  instructions="You place orders for the user with the place_order tool, then confirm the order in one short sentence.",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=256, temperature=0))
    return agent, orders


def _connect(server) -> None:
    """A client for this test's event loop, the SDK's default: the Responses API."""
    import openai
    from agents import set_default_openai_client

    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)


def _check_schema_has_defs(agent) -> None:
    [tool] = agent.tools
    assert "$defs" in tool.params_json_schema and tool.strict_json_schema


@pytest.mark.slow
def test_agent_calls_a_tool_with_a_nested_pydantic_argument(server, shop):
    from agents import Runner

    _connect(server)
    agent, orders = shop
    _check_schema_has_defs(agent)
    before = len(orders)
    result = Runner.run_sync(agent, QUESTION)
    assert len(orders) == before + 1 and isinstance(orders[-1].ship_to, Address)
    assert isinstance(result.final_output, str) and result.final_output
    assert [r.response_id.startswith("resp_") for r in result.raw_responses] == [True, True]


def test_agent_streams_with_run_streamed(server, shop):
    from agents import Runner

    agent, orders = shop
    before = len(orders)

    async def run() -> tuple[list[str], list[str], object]:
        _connect(server)
        result = Runner.run_streamed(agent, QUESTION)
        raw, items = [], []
        async for event in result.stream_events():
            if event.type == "raw_response_event":
                raw.append(event.data.type)
            elif event.type == "run_item_stream_event":
                items.append(event.name)
        return raw, items, result

    raw, items, result = asyncio.run(run())
    assert len(orders) == before + 1 and orders[-1].ship_to.city
    assert items[:2] == ["tool_called", "tool_output"] and "message_output_created" in items
    assert "response.function_call_arguments.delta" in raw and "response.output_text.delta" in raw
    assert raw.count("response.created") == 2 and raw.count("response.completed") + raw.count("response.incomplete") == 2
    assert isinstance(result.final_output, str) and result.final_output


@pytest.mark.slow  # three short answers of the real model (~40 s on a loaded 2-core box)
def test_a_conversation_by_previous_response_id_reaches_the_model(server):
    """The earlier turns really are in the prompt: the model answers a follow-up that only
    makes sense with them."""
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input="What is the capital of France?", max_output_tokens=24,
                                    temperature=0)
    assert "Paris" in first.output_text
    second = client.responses.create(model=model, input="And of Germany?", previous_response_id=first.id,
                                     max_output_tokens=24, temperature=0)
    assert "Berlin" in second.output_text
    alone = client.responses.create(model=model, input="And of Germany?", max_output_tokens=24, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens
