"""End-to-end tool loops of agent frameworks against a running `agentkv serve` (default model).

Usage: e2e_frameworks.py BASE_URL. The server must serve the model as "agentkv-e2e" without API
keys (crates/agentkv/tests/serve_frameworks.rs writes that config).
- langchain-openai: `ChatOpenAI(...).bind_tools([...])`, a loop that executes each call and sends
  the result back until the model answers (at most 4 calls), and `with_structured_output`;
- the OpenAI Agents SDK: an `Agent` with a `function_tool` under `Runner.run_sync`, once over the
  Responses API (`OpenAIResponsesModel`, the SDK's default path) and once over chat completions
  (`OpenAIChatCompletionsModel`), then an `Agent` with an `output_type` (structured output).
Each asserts that the loop reaches a model call carrying the tool's result, that the call's
arguments match the tool's schema, that the later calls' prompts came from the prefix cache, and
that the loop ends with an answer.
A framework whose package cannot be imported is skipped with a message saying so (CI installs
both). Exits non-zero with a message on the first failed check.
"""
import json
import sys

BASE = sys.argv[1]
MODEL = "agentkv-e2e"
SYSTEM = "You are a helpful assistant. Call get_weather to learn the weather, then answer."
QUESTION = "What is the weather in Paris?"


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what)


def weather(city):
    return f"18 C and sunny in {city}"


def langchain_loop():
    try:
        from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
    except ImportError as e:
        print(f"SKIPPED langchain-openai: cannot import it ({e}); pip install langchain-openai")
        return

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return weather(city)

    llm = ChatOpenAI(model=MODEL, base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=96,
                     max_retries=0, timeout=120)
    messages = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
    # The first call must use the tool; later ones may answer.
    ai = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False).invoke(messages)
    usages = [ai.usage_metadata]
    results = 0
    while ai.tool_calls and len(usages) < 4:
        messages.append(ai)
        for tc in ai.tool_calls:
            check(tc["name"] == "get_weather" and set(tc["args"]) == {"city"} and
                  isinstance(tc["args"]["city"], str),
                  f"langchain: call {len(usages)} matches the schema ({tc['args']})")
            messages.append(ToolMessage(get_weather.invoke(tc["args"]), tool_call_id=tc["id"]))
            results += 1
        ai = llm.bind_tools([get_weather], parallel_tool_calls=False).invoke(messages)
        usages.append(ai.usage_metadata)
    check(results >= 1 and len(usages) >= 2, f"langchain: the loop reached call {len(usages)} carrying "
          f"{results} tool result(s); last reply: {ai.content!r} {ai.tool_calls}")
    check(not ai.tool_calls and ai.content, f"langchain: the loop ends with an answer: {ai.content!r}")
    for i in range(1, len(usages)):
        cached = usages[i]["input_token_details"]["cache_read"]
        check(cached > 0 and cached >= usages[i - 1]["input_tokens"] // 16 * 16,
              f"langchain: call {i + 1} read {cached} of {usages[i]['input_tokens']} prompt tokens from "
              f"the cache (call {i}: {usages[i - 1]['input_tokens']})")

    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    for method in ["json_schema", "function_calling", "json_mode"]:
        out = llm.with_structured_output(City, method=method).invoke(
            "Where is the Eiffel tower? Answer as JSON with the keys name and country.")
        check(isinstance(out, City), f"langchain: with_structured_output(method={method!r}) gives {out!r}")


def agents_runs():
    try:
        from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel,
                            OpenAIResponsesModel, RunHooks, Runner, function_tool, set_tracing_disabled)
        from openai import AsyncOpenAI
    except ImportError as e:
        print(f"SKIPPED openai-agents: cannot import it ({e}); pip install openai-agents")
        return
    from pydantic import BaseModel, Field

    set_tracing_disabled(True)
    cities = []

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return weather(city)

    class Calls(RunHooks):
        """Records what each model call was sent and how much of its prompt was cached."""

        def __init__(self):
            self.inputs, self.cached, self.prompt = [], [], []

        async def on_llm_start(self, context, agent, system_prompt, input_items):
            self.inputs.append([i.get("type", "message") for i in input_items])

        async def on_llm_end(self, context, agent, response):
            self.cached.append(response.usage.input_tokens_details.cached_tokens)
            self.prompt.append(response.usage.input_tokens)

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
    for kind, model in [("responses", OpenAIResponsesModel(model=MODEL, openai_client=client)),
                        ("chat completions", OpenAIChatCompletionsModel(model=MODEL, openai_client=client))]:
        cities.clear()
        hooks = Calls()
        # tool_choice "required" for the first call; the SDK resets it to auto after a tool ran.
        agent = Agent(name="weather", instructions=SYSTEM, tools=[get_weather], model=model,
                      model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=200,
                                                   parallel_tool_calls=False))
        try:
            result = Runner.run_sync(agent, QUESTION, max_turns=3, hooks=hooks)
            ending = f"final output {result.final_output!r}"
        except MaxTurnsExceeded:
            sys.exit(f"FAILED: agents ({kind}): the model kept calling the tool until max_turns "
                     f"(calls sent {hooks.inputs})")
        check(cities and all(isinstance(c, str) and c for c in cities),
              f"agents ({kind}): the function tool ran with valid arguments {cities}")
        check(len(hooks.inputs) >= 2 and "function_call_output" in hooks.inputs[1],
              f"agents ({kind}): call 2 carries the tool result {hooks.inputs[1] if len(hooks.inputs) > 1 else None}")
        check(len(hooks.cached) >= 2 and all(c > 0 for c in hooks.cached[1:]),
              f"agents ({kind}): later calls read their prompt from the cache "
              f"(cached {hooks.cached} of {hooks.prompt}); {ending}")
        # output_type: the final answer is structured output (with a tool offered too).
        agent = Agent(name="geo", instructions="Answer with the city and its country.", output_type=City,
                      tools=[get_weather], model=model,
                      model_settings=ModelSettings(temperature=0, max_tokens=96))
        result = Runner.run_sync(agent, "Where is the Eiffel tower?", max_turns=3)
        check(isinstance(result.final_output, City),
              f"agents ({kind}): output_type gives a validated object {result.final_output!r}")


langchain_loop()
agents_runs()
print("ALL FRAMEWORK CHECKS PASSED")
