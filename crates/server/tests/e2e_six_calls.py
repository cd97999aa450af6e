"""Six-call tool loops of agent frameworks against a running `agentkv serve` (default model).

Usage: e2e_six_calls.py BASE_URL. The server must serve the model as "agentkv-e2e" without API
keys (crates/agentkv/tests/serve_frameworks.rs writes that config).

The task needs six tool calls (the weather in six cities, one per call). Each framework runs its
own loop for six model calls that each carry every earlier tool result:
- langchain-openai: `bind_tools` with `tool_choice="any"` for the first six calls, then `auto`;
- the OpenAI Agents SDK: `Runner.run_sync` with `tool_choice="required"` kept across turns
  (`reset_tool_choice=False`) over chat completions, ending at `max_turns=6` unless the model
  stops by itself;
- smolagents: a `ToolCallingAgent` (its calls are always `tool_choice="required"`; it ends when
  the model calls `final_answer`) with `max_steps=6`.
Every loop sends `parallel_tool_calls=False`, so each model call is one tool call.
Checked for each: six model calls happened, every call's arguments match the tool's schema, and
each later call read at least the previous call's prompt (whole blocks) from the prefix cache.
Reported, not asserted (it depends on what a 135M model decides, not on the server): whether the
loop *completed* — the model answered (or called `final_answer`) after its calls — and how many
distinct cities it asked for.
A framework whose package cannot be imported is skipped with a message saying so. Exits non-zero
with a message on the first failed check.
"""
import sys

BASE = sys.argv[1]
MODEL = "agentkv-e2e"
CITIES = ["Paris", "London", "Rome", "Berlin", "Madrid", "Oslo"]
SYSTEM = "You are a helpful assistant. Call get_weather once per city, one city per call, then answer."
QUESTION = "What is the weather in " + ", ".join(CITIES) + "?"
SUMMARY = []


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what)


def weather(city):
    return f"18 C and sunny in {city}"


def check_cache(name, prompts, cached):
    check(len(prompts) >= 6, f"{name}: six model calls ({len(prompts)})")
    for i in range(1, len(prompts)):
        check(cached[i] > 0 and cached[i] >= prompts[i - 1] // 16 * 16,
              f"{name}: call {i + 1} read {cached[i]} of {prompts[i]} prompt tokens from the cache "
              f"(call {i}: {prompts[i - 1]})")


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
    prompts, cached, asked = [], [], []
    ai = None
    for n in range(7):
        choice = "any" if n < 6 else "auto"
        ai = llm.bind_tools([get_weather], tool_choice=choice, parallel_tool_calls=False).invoke(messages)
        prompts.append(ai.usage_metadata["input_tokens"])
        cached.append(ai.usage_metadata["input_token_details"]["cache_read"])
        if n < 6:
            check(len(ai.tool_calls) == 1, f"langchain: call {n + 1} is one tool call ({ai.tool_calls})")
        if not ai.tool_calls:
            break
        messages.append(ai)
        for tc in ai.tool_calls:
            check(tc["name"] == "get_weather" and set(tc["args"]) == {"city"} and
                  isinstance(tc["args"]["city"], str),
                  f"langchain: call {n + 1} matches the schema ({tc['args']})")
            asked.append(tc["args"]["city"])
            messages.append(ToolMessage(get_weather.invoke(tc["args"]), tool_call_id=tc["id"]))
    check_cache("langchain", prompts, cached)
    done = not ai.tool_calls and bool(ai.content)
    SUMMARY.append(f"langchain-openai: 6 valid calls from the cache; completed (answered on call 7): "
                   f"{'yes' if done else 'no'}; distinct cities asked: {len(set(asked))} {sorted(set(asked))}")


def agents_loop():
    try:
        from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel, RunHooks,
                            Runner, function_tool, set_tracing_disabled)
        from openai import AsyncOpenAI
    except ImportError as e:
        print(f"SKIPPED openai-agents: cannot import it ({e}); pip install openai-agents")
        return
    set_tracing_disabled(True)
    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return weather(city)

    class Calls(RunHooks):
        def __init__(self):
            self.cached, self.prompt = [], []

        async def on_llm_end(self, context, agent, response):
            self.cached.append(response.usage.input_tokens_details.cached_tokens)
            self.prompt.append(response.usage.input_tokens)

    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
    agent = Agent(name="weather", instructions=SYSTEM, tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                  reset_tool_choice=False,
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=96,
                                               parallel_tool_calls=False))
    hooks = Calls()
    try:
        result = Runner.run_sync(agent, QUESTION, max_turns=6, hooks=hooks)
        done = f"yes ({result.final_output!r})"
    except MaxTurnsExceeded:
        done = "no (max_turns=6 reached while still calling the tool)"
    check(len(asked) >= 6 and all(isinstance(c, str) and c for c in asked),
          f"agents: the function tool ran six times with valid arguments {asked}")
    check_cache("agents", hooks.prompt, hooks.cached)
    SUMMARY.append(f"openai-agents: 6 valid calls from the cache; completed: {done}; "
                   f"distinct cities asked: {len(set(asked))} {sorted(set(asked))}")


def smolagents_loop():
    try:
        from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    except ImportError as e:
        print(f"SKIPPED smolagents: cannot import it ({e}); pip install smolagents")
        return
    asked = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: the city's name
        """
        asked.append(city)
        return weather(city)

    # One call per step (`parallel_tool_calls=False`, sent with every request): free to write
    # several, the 135M model may list cities until `max_tokens` cuts the reply (a cut call is
    # returned as text, with `finish_reason: "length"`), which says nothing about the server.
    model = OpenAIServerModel(model_id=MODEL, api_base=BASE + "/v1", api_key="none", temperature=0,
                              max_tokens=96, parallel_tool_calls=False)
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=6, verbosity_level=0)
    out = agent.run(QUESTION)
    steps = [s for s in agent.memory.steps if getattr(s, "model_output_message", None) is not None]
    prompts, cached = [], []
    finished = False
    for i, s in enumerate(steps[:6]):
        usage = s.model_output_message.raw.usage
        prompts.append(usage.prompt_tokens)
        cached.append(usage.prompt_tokens_details.cached_tokens)
        calls = s.tool_calls or []
        check(calls, f"smolagents: step {i + 1} made tool calls")
        for c in calls:
            if c.name == "final_answer":
                finished = True
                continue
            check(c.name == "get_weather" and isinstance(c.arguments, dict) and set(c.arguments) == {"city"}
                  and isinstance(c.arguments["city"], str),
                  f"smolagents: step {i + 1} calls {c.name}({c.arguments}) as the schema says")
    if finished:
        SUMMARY.append(f"smolagents: completed with final_answer after {len(steps)} steps: {out!r}")
        return
    check_cache("smolagents", prompts, cached)
    SUMMARY.append(f"smolagents: 6 steps of valid calls from the cache; completed (final_answer): no; "
                   f"distinct cities asked: {len(set(asked))} {sorted(set(asked))}")


langchain_loop()
agents_loop()
smolagents_loop()
print("SIX-CALL LOOPS:")
for line in SUMMARY:
    print("  " + line)
print("ALL SIX-CALL CHECKS PASSED")
