"""Agent frameworks with nested pydantic tools and outputs, and parallel calls, against a running
`agentkv serve` (default model) — issue #45's framework matrix.

Usage: e2e_frameworks_nested.py BASE_URL. The server serves the model as "agentkv-e2e" without
API keys (crates/agentkv/tests/serve_frameworks.rs writes that config).
- the OpenAI Agents SDK: a `function_tool` whose argument is a nested pydantic model (its schema
  has `$defs`/`$ref`), over the Responses API and over chat completions;
- pydantic-ai: an `Agent` with a nested `output_type` (its output tool's schema has `$defs`);
- LangGraph: `create_react_agent` with two tools and parallel calls allowed (the default);
- smolagents: a `ToolCallingAgent` with a large `max_tokens`, to a final answer.
Checked (what the server causes): every request is answered (no HTTP error), tool arguments and
outputs validate with pydantic against the nested models, no assistant message carries the raw
tool-call JSON as its content. Reported, not asserted (what a 135M model decides): whether
smolagents reached `final_answer` within its steps.
A framework whose package cannot be imported is skipped with a message saying so (CI installs
them all). Exits non-zero with a message on the first failed check.
"""
import json
import sys

BASE = sys.argv[1]
MODEL = "agentkv-e2e"
SUMMARY = []


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what)


def raw_call_json(text):
    """A reply whose text is the tool-call JSON the server should have parsed."""
    t = (text or "").lstrip()
    return t.startswith('{"tool_call') or t.startswith('{"name"')


def agents_nested_tool():
    try:
        from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel,
                            OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled)
        from openai import AsyncOpenAI
    except ImportError as e:
        print(f"SKIPPED openai-agents: cannot import it ({e})")
        return
    from pydantic import BaseModel, Field

    set_tracing_disabled(True)

    class Item(BaseModel):
        name: str = Field(max_length=16)
        quantity: int = Field(ge=1, le=9)

    class Order(BaseModel):
        customer: str = Field(max_length=16)
        items: list[Item] = Field(max_length=3)

    placed = []

    @function_tool
    def place_order(order: Order) -> str:
        """Place an order for a customer."""
        placed.append(order)
        return f"order placed: {len(order.items)} item(s)"

    check("$defs" in json.dumps(place_order.params_json_schema) or
          "$ref" in json.dumps(place_order.params_json_schema),
          "agents: a function_tool with a nested model has $defs/$ref in its schema")
    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
    for kind, model in [("responses", OpenAIResponsesModel(model=MODEL, openai_client=client)),
                        ("chat completions", OpenAIChatCompletionsModel(model=MODEL, openai_client=client))]:
        placed.clear()
        agent = Agent(name="shop", instructions="Place the order the user asks for with place_order, then confirm.",
                      tools=[place_order], model=model,
                      model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=200,
                                                   parallel_tool_calls=False))
        # Whether a 135M model stops calling the tool after its result is the model's business:
        # the turns it takes are reported, what the server returned is checked.
        try:
            result = Runner.run_sync(agent, "Order two apples and one pear for Ann.", max_turns=3)
            final = result.final_output
            check(not raw_call_json(str(final)),
                  f"agents ({kind}): the final output is not raw tool JSON {final!r}")
        except MaxTurnsExceeded:
            final = "(max_turns: the model kept calling the tool)"
        check(placed and all(isinstance(o, Order) for o in placed),
              f"agents ({kind}): the nested-model tool ran with validated arguments {placed[:1]}")
        SUMMARY.append(f"agents ({kind}): {len(placed)} validated call(s); final output {str(final)[:60]!r}")


def pydantic_ai_nested_output():
    try:
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
    except ImportError as e:
        print(f"SKIPPED pydantic-ai: cannot import it ({e})")
        return
    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=20)
        country: str = Field(max_length=20)

    class Person(BaseModel):
        name: str = Field(max_length=20)
        address: Address

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=BASE + "/v1", api_key="none"))
    agent = Agent(model, output_type=Person, retries=0)
    r = agent.run_sync("Describe a person who lives in Paris: their name and address.",
                       model_settings={"temperature": 0, "max_tokens": 160})
    check(isinstance(r.output, Person) and isinstance(r.output.address, Address),
          f"pydantic-ai: a nested output_type validates {r.output!r}")


def langgraph_parallel():
    try:
        from langchain_core.messages import AIMessage, ToolMessage
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent
    except ImportError as e:
        print(f"SKIPPED langgraph: cannot import it ({e})")
        return

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"18 C and sunny in {city}"

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model=MODEL, base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=300,
                     max_retries=0, timeout=120)
    agent = create_react_agent(llm, [get_weather, add])
    out = agent.invoke({"messages": [("user", "Add 2 and 3, and tell me the weather in Paris.")]},
                       {"recursion_limit": 8})
    msgs = out["messages"]
    ai = [m for m in msgs if isinstance(m, AIMessage)]
    tools_run = [m for m in msgs if isinstance(m, ToolMessage)]
    check(ai and not any(raw_call_json(m.content if isinstance(m.content, str) else "") for m in ai),
          f"langgraph (parallel calls allowed): no reply is raw tool JSON ({len(ai)} model replies)")
    check(tools_run, f"langgraph: the tools ran ({[m.name for m in tools_run]})")


def smolagents_final_answer():
    try:
        from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    except ImportError as e:
        print(f"SKIPPED smolagents: cannot import it ({e})")
        return

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: the city's name
        """
        return f"18 C and sunny in {city}"

    model = OpenAIServerModel(model_id=MODEL, api_base=BASE + "/v1", api_key="none", temperature=0,
                              max_tokens=1024)
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=4, verbosity_level=0)
    out = agent.run("What is the weather in Paris?")
    steps = [s for s in agent.memory.steps if getattr(s, "model_output_message", None) is not None]
    finished = False
    for i, s in enumerate(steps):
        content = s.model_output_message.content
        check(not raw_call_json(content if isinstance(content, str) else ""),
              f"smolagents: step {i + 1}'s reply is parsed calls, not raw JSON")
        for c in s.tool_calls or []:
            finished |= c.name == "final_answer"
    SUMMARY.append(f"smolagents (max_tokens 1024): final_answer reached: {finished} after {len(steps)} "
                   f"step(s): {str(out)[:80]!r}")


agents_nested_tool()
pydantic_ai_nested_output()
langgraph_parallel()
smolagents_final_answer()
print("NESTED FRAMEWORK RUNS:")
for line in SUMMARY:
    print("  " + line)
print("ALL NESTED FRAMEWORK CHECKS PASSED")
