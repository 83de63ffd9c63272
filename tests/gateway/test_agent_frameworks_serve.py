"""Issue 52's first acceptance line: agent frameworks in their default modes, with ``tool_choice``
auto, against a real ``tokenops serve`` on the default model (SmolLM2-135M-Instruct, whose chat
template renders no tools: the generic tool format, tokenops/backends/tool_format.py).

openai-agents (its default mode: the Responses API), LangGraph's ``create_react_agent`` (over
langchain-openai's ``ChatOpenAI``) and pydantic-ai (``OpenAIChatModel``) each get a question that
needs the one tool they hold: the tool is called with the city from the question, and the agent's
final answer is text that uses what the tool returned. Greedy decoding (``temperature`` 0).
"""

from __future__ import annotations

import asyncio

import pytest
from tests.real_model import MODEL, SERVE_ENV, serve_args
from tokenops.testing_serve import ServeProcess

QUESTION = "What's the weather in Paris?"
RESULT = "Sunny, 22 degrees Celsius in {city}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("agent-frameworks"), args=serve_args(), env=SERVE_ENV, store=False) as s:
        yield s


def weather(seen: list[str], city: str) -> str:
    seen.append(city)
    return RESULT.format(city=city)


def _check(seen: list[str], answer: object) -> None:
    assert seen == ["Paris"]  # the obvious tool, once, with the city of the question
    assert isinstance(answer, str) and "<tool_call>" not in answer
    assert "22" in answer or "sunny" in answer.lower(), answer  # answered from the tool's result


def test_openai_agents_default_mode_calls_the_tool_and_answers_from_it(srv):
    pytest.importorskip("agents")
    import openai
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export to OpenAI
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return weather(seen, city)

    async def run() -> object:
        # the SDK's default client and mode: the Responses API; tool_choice left to the SDK (auto)
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=600)
        set_default_openai_client(client, use_for_tracing=False)
        agent = Agent(name="weather", model=MODEL, tools=[get_weather],
                      model_settings=ModelSettings(temperature=0, max_tokens=64))
        result = await Runner.run(agent, QUESTION, max_turns=4)
        return result.final_output

    _check(seen, asyncio.run(run()))


def test_langgraph_react_agent_calls_the_tool_and_answers_from_it(srv):
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    seen: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return weather(seen, city)

    llm = ChatOpenAI(model=MODEL, base_url=srv.base_url, api_key="unused", temperature=0, max_tokens=64,
                     max_retries=0, timeout=600)
    agent = create_react_agent(llm, [get_weather])
    out = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 8})
    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]  # call, result, answer
    _check(seen, out["messages"][-1].content)


def test_pydantic_ai_calls_the_tool_and_answers_from_it(srv):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[str] = []
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=srv.base_url, api_key="unused"))
    agent = Agent(model, model_settings={"temperature": 0, "max_tokens": 64})

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return weather(seen, city)

    _check(seen, agent.run_sync(QUESTION).output)
