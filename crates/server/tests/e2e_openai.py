"""End-to-end checks of a running `agentkv serve` with the official `openai` client (unchanged).

Usage: e2e_openai.py BASE_URL   (e.g. http://127.0.0.1:8000). The server must run the config
written by crates/agentkv/tests/serve_openai.rs: tenants alpha (key ka) and beta (key kb), admin
key "admin", max_requests_per_tenant 2, max_requests 3, warm-up prompt "system", model name
"agentkv-e2e" with the alias "m", unknown fields rejected (the default).
Exits non-zero with a message on the first failed check.
"""
import json
import sys
import time
import urllib.error
import urllib.request

import openai

BASE = sys.argv[1]
SYSTEM = "You are a careful coding agent. Read files before editing them and run the tests."


def client(key):
    return openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0, timeout=120)


def get(path, key=None):
    req = urllib.request.Request(BASE + path)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def stats():
    return json.loads(get("/v1/cache/stats", "admin"))


def tenant_hits(name):
    for t in stats()["tenants"]:
        if t["tenant"] == name:
            return t["hit_tokens"]
    return 0


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what)


alpha, beta = client("ka"), client("kb")
msgs = lambda user: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

def post(path, body, key):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Authorization", "Bearer " + key)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read().decode())


# Models ("m" is an alias from the config) and a plain chat.
check([m.id for m in alpha.models.list()] == ["agentkv-e2e", "m"], "models.list: name and alias")
check(alpha.models.retrieve("agentkv-e2e").id == "agentkv-e2e", "models.retrieve")
try:
    alpha.models.retrieve("gpt-4o")
    check(False, "unknown model id refused")
except openai.NotFoundError as e:
    check(e.code == "model_not_found", "models.retrieve of an unknown id gets 404 model_not_found")
r = alpha.chat.completions.create(model="agentkv-e2e", messages=msgs("Say hello."), max_tokens=8, temperature=0)
check(r.choices[0].message.role == "assistant" and r.usage.completion_tokens > 0, "chat completion")
check(r.usage.prompt_tokens_details.cached_tokens is not None, "cached_tokens always present")

# Strict parameters: an unknown model is 404, an unsupported or unknown field is 400 naming it.
try:
    alpha.chat.completions.create(model="gpt-4o", messages=msgs("Hi."), max_tokens=2)
    check(False, "wrong model refused")
except openai.NotFoundError as e:
    check(e.status_code == 404 and e.code == "model_not_found" and e.param == "model",
          "wrong model gets 404 model_not_found")
for field, value in [("best_of", 2), ("guided_decoding_backend", "xgrammar"), ("frobnicate", 1)]:
    try:
        alpha.chat.completions.create(model="m", messages=msgs("Hi."), max_tokens=2,
                                      extra_body={field: value})
        check(False, f"{field} refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == field, f"unknown/unsupported {field} gets 400 naming it")
try:
    alpha.completions.create(model="m", prompt="def f(", suffix="return 1", max_tokens=2)
    check(False, "suffix refused")
except openai.BadRequestError as e:
    check(e.param == "suffix", "completions suffix gets 400 naming it")
try:
    alpha.chat.completions.create(model="m", messages=msgs("Hi."), max_tokens=2, tool_choice=12345)
    check(False, "tool_choice of the wrong type refused")
except openai.BadRequestError as e:
    check(e.param == "tool_choice", "tool_choice: 12345 gets 400 naming it")

# logit_bias: banning the greedy first token changes the output.
question = msgs("What is the capital of France?")
greedy = alpha.chat.completions.create(model="m", messages=question, max_tokens=6, temperature=0)
first = alpha.chat.completions.create(model="m", messages=question, max_tokens=1, temperature=0)
ids = post("/tokenize", {"prompt": first.choices[0].message.content, "add_special_tokens": False}, "ka")["tokens"]
check(len(ids) == 1, f"the greedy first token is one token ({ids})")
banned = alpha.chat.completions.create(model="m", messages=question, max_tokens=6, temperature=0,
                                       logit_bias={str(ids[0]): -100})
check(banned.choices[0].message.content != greedy.choices[0].message.content and
      not banned.choices[0].message.content.startswith(first.choices[0].message.content),
      f"logit_bias -100 on the greedy token changes the output "
      f"({greedy.choices[0].message.content!r} -> {banned.choices[0].message.content!r})")
try:
    alpha.chat.completions.create(model="m", messages=question, max_tokens=1, logit_bias={str(ids[0]): -150})
    check(False, "logit_bias out of range refused")
except openai.BadRequestError as e:
    check(e.param == "logit_bias", "logit_bias outside [-100, 100] gets 400")

# Tool calls (the generic mode: the default model's template has no tool support).
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}},
         {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["timezone"], "additionalProperties": False}}}]
ask = msgs("What is the weather in Paris?")


def valid_call(tc):
    args = json.loads(tc.function.arguments)
    if tc.function.name == "get_weather":
        return tc.id.startswith("call_") and set(args) == {"city"} and isinstance(args["city"], str)
    return tc.function.name == "get_time" and args == {"timezone": args.get("timezone")} and \
        args["timezone"] in ("UTC", "CET")


t1 = alpha.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="required",
                                   parallel_tool_calls=False, max_tokens=64, temperature=0)
c1 = t1.choices[0]
check(c1.finish_reason == "tool_calls" and len(c1.message.tool_calls) == 1 and valid_call(c1.message.tool_calls[0]),
      f"tool_choice required: a call whose arguments match the schema ({c1.message.tool_calls})")
tn = alpha.chat.completions.create(model="m", messages=ask, tools=tools, parallel_tool_calls=False,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}},
                                   max_tokens=64, temperature=0)
check(tn.choices[0].message.tool_calls[0].function.name == "get_time" and
      valid_call(tn.choices[0].message.tool_calls[0]), "named tool_choice calls that tool")
tp = alpha.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="required",
                                   max_tokens=128, temperature=0)
check(tp.choices[0].finish_reason == "tool_calls" and all(valid_call(t) for t in tp.choices[0].message.tool_calls),
      f"parallel_tool_calls (default): {len(tp.choices[0].message.tool_calls)} valid call(s)")
ta = alpha.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="auto", max_tokens=64,
                                   temperature=0)
check((ta.choices[0].message.tool_calls and all(valid_call(t) for t in ta.choices[0].message.tool_calls)) or
      (ta.choices[0].message.content and not ta.choices[0].message.content.lstrip().startswith("{")),
      "tool_choice auto: valid calls or plain text")
tnone = alpha.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="none", max_tokens=8,
                                      temperature=0)
check(tnone.choices[0].message.tool_calls is None and tnone.choices[0].message.content, "tool_choice none: text")

# The tool result goes back; the second call reuses the first call's prompt from the cache.
call = c1.message.tool_calls[0]
loop = ask + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
t2 = alpha.chat.completions.create(model="m", messages=loop, tools=tools, tool_choice="auto",
                                   parallel_tool_calls=False, max_tokens=48, temperature=0)
cached = t2.usage.prompt_tokens_details.cached_tokens
check(cached >= t1.usage.prompt_tokens // 16 * 16,
      f"second call of the tool loop: {cached} of {t2.usage.prompt_tokens} prompt tokens cached "
      f"(first call's prompt: {t1.usage.prompt_tokens})")
try:
    alpha.chat.completions.create(model="m", messages=ask + [{"role": "tool", "tool_call_id": "call_nope",
                                                             "content": "x"}], tools=tools, max_tokens=4)
    check(False, "tool result for an unknown call refused")
except openai.BadRequestError as e:
    check(e.param == "messages[2].tool_call_id", "a tool result for an unknown call id gets 400")

# Streamed: OpenAI's tool_calls deltas, assembled by index.
parts = {}
finish = None
for chunk in alpha.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=64, temperature=0, stream=True):
    for ch in chunk.choices:
        for d in ch.delta.tool_calls or []:
            p = parts.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            p["id"] = d.id or p["id"]
            p["name"] += (d.function.name or "") if d.function else ""
            p["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = ch.finish_reason or finish
check(finish == "tool_calls" and parts and parts[0]["name"] == call.function.name and
      parts[0]["arguments"] == call.function.arguments, "streamed tool call equals the whole one")

# Structured output: parse() with a Pydantic model; json_object; vLLM's guided_choice; bad schema.
from typing import Literal

import pydantic


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int = pydantic.Field(ge=0, le=120)
    city: Literal["Paris", "Rome", "Oslo"]


parsed = alpha.chat.completions.parse(model="m", messages=msgs("Describe a person: name, age and city."),
                                      response_format=Person, max_tokens=96, temperature=0)
p = parsed.choices[0].message.parsed
check(isinstance(p, Person) and Person.model_validate_json(parsed.choices[0].message.content) == p,
      f"chat.completions.parse() with a Pydantic model: {p!r}")
jo = alpha.chat.completions.create(model="m", messages=msgs("Return a JSON object with the keys city and country for Paris."),
                                   response_format={"type": "json_object"}, max_tokens=128, temperature=0)
check(jo.choices[0].finish_reason == "stop" and isinstance(json.loads(jo.choices[0].message.content), dict),
      f"response_format json_object parses as a JSON object: {jo.choices[0].message.content}")
parts = [c.choices[0].delta.content or "" for c in alpha.chat.completions.create(
    model="m", messages=msgs("Describe a person: name, age and city."), max_tokens=96, temperature=0,
    stream=True, response_format={"type": "json_schema", "json_schema": {
        "name": "Person", "schema": Person.model_json_schema()}}) if c.choices]
check(isinstance(Person.model_validate_json("".join(parts)), Person),
      f"streamed structured output validates: {''.join(parts)}")
gc = alpha.chat.completions.create(model="m", messages=msgs("Is the sky blue?"), max_tokens=4, temperature=0,
                                   extra_body={"guided_choice": ["yes", "no"]})
check(gc.choices[0].message.content in ("yes", "no"), "vLLM guided_choice")
gg = alpha.chat.completions.create(model="m", messages=msgs("Is the sky blue?"), max_tokens=4, temperature=0,
                                   extra_body={"grammar": 'root ::= "yes" | "no" # GBNF'})
check(gg.choices[0].message.content in ("yes", "no"), "a GBNF grammar")
try:
    alpha.chat.completions.create(model="m", messages=msgs("Hi."), max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicated"}}})
    check(False, "invalid schema refused")
except openai.BadRequestError as e:
    check(e.param == "response_format", "an invalid schema gets 400 naming response_format")

# The Responses API: plain, a function tool with tool_choice required, a second turn through
# previous_response_id carrying the function_call_output (its prompt a cached prefix), parse(),
# streaming with typed events, retrieve and delete.
weather = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": False}, "strict": True}]
r1 = alpha.responses.create(model="m", input="Say hello.", instructions="Be brief.", max_output_tokens=8,
                            temperature=0)
check(r1.object == "response" and r1.output_text and r1.output[0].type == "message" and
      r1.usage.input_tokens_details.cached_tokens is not None, f"responses.create: {r1.output_text!r}")
rt = alpha.responses.create(model="m", instructions=SYSTEM, input="What is the weather in Paris?",
                            tools=weather, tool_choice="required", parallel_tool_calls=False,
                            max_output_tokens=64, temperature=0)
fc = rt.output[0]
check(rt.status == "completed" and fc.type == "function_call" and fc.name == "get_weather" and
      set(json.loads(fc.arguments)) == {"city"}, f"responses with a function tool, required: {fc.arguments}")
rt2 = alpha.responses.create(model="m", instructions=SYSTEM, previous_response_id=rt.id, tools=weather,
                             parallel_tool_calls=False,
                             input=[{"type": "function_call_output", "call_id": fc.call_id,
                                     "output": "18 C and sunny"}], max_output_tokens=48, temperature=0)
cached = rt2.usage.input_tokens_details.cached_tokens
check(cached > 0 and cached >= rt.usage.input_tokens // 16 * 16,
      f"second turn via previous_response_id: {cached} of {rt2.usage.input_tokens} input tokens cached "
      f"(first turn: {rt.usage.input_tokens}); output {rt2.output[0].type}")
pr = alpha.responses.parse(model="m", input="Describe a person: name, age and city.", text_format=Person,
                           max_output_tokens=96, temperature=0)
check(isinstance(pr.output_parsed, Person), f"responses.parse() with a Pydantic model: {pr.output_parsed!r}")
# Issue #45. Nested pydantic tools ($defs/$ref) on chat and on Responses, their arguments
# validated by pydantic itself.
class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    quantity: int = pydantic.Field(ge=1, le=9)


class Order(pydantic.BaseModel):
    customer: str = pydantic.Field(max_length=16)
    items: list[Item] = pydantic.Field(max_length=3)


order_tool = openai.pydantic_function_tool(Order, name="place_order", description="Place an order")
check("$defs" in json.dumps(order_tool), "pydantic_function_tool emits $defs/$ref")
oc = alpha.chat.completions.create(model="m", messages=msgs("Order two apples and one pear for Ann."),
                                   tools=[order_tool], tool_choice="required", parallel_tool_calls=False,
                                   max_tokens=160, temperature=0)
ocall = oc.choices[0].message.tool_calls[0]
check(oc.choices[0].finish_reason == "tool_calls" and
      isinstance(Order.model_validate_json(ocall.function.arguments), Order),
      f"a nested pydantic tool on chat: {ocall.function.arguments}")
ro = alpha.responses.create(model="m", input="Order two apples and one pear for Ann.",
                            tools=[{"type": "function", "name": "place_order", "description": "Place an order",
                                    "parameters": Order.model_json_schema(), "strict": False}],
                            tool_choice="required", parallel_tool_calls=False, max_output_tokens=160,
                            temperature=0)
check(ro.output[0].type == "function_call" and
      isinstance(Order.model_validate_json(ro.output[0].arguments), Order),
      f"a nested pydantic tool on Responses: {ro.output[0].arguments}")
# A call list cut by max_tokens: the complete calls or none, never the raw JSON as content.
cut = alpha.chat.completions.create(model="m", messages=msgs("Add 2 and 3, then the weather in Paris."),
                                    tools=tools, tool_choice="required", max_tokens=24, temperature=0)
cm = cut.choices[0].message
check(cut.choices[0].finish_reason == "length" and not (cm.content or "").lstrip().startswith("{") and
      all(valid_call(t) for t in (cm.tool_calls or [])),
      f"a cut call list is never raw JSON: content {cm.content!r}, {len(cm.tool_calls or [])} call(s)")
# OpenAI's own fields are accepted and named as ignored.
raw = alpha.chat.completions.with_raw_response.create(
    model="m", messages=msgs("Hi."), max_tokens=2, metadata={"run": "7"}, store=True,
    service_tier="auto", extra_body={"reasoning_effort": "low", "verbosity": "low"})
ignored = raw.headers.get("x-agentkv-ignored-fields", "")
stored = raw.parse()
check(stored.choices[0].message is not None and
      {"service_tier", "reasoning_effort", "verbosity"} <= set(ignored.split(", ")),
      f"OpenAI fields accepted and named as ignored: {ignored!r}")
# store: true keeps the completion (retrieve, messages, list by metadata, delete), streamed too.
got = alpha.chat.completions.retrieve(stored.id)
check(got.id == stored.id and got.choices[0].message.content == stored.choices[0].message.content and
      got.metadata == {"run": "7"}, "a stored chat completion is retrieved with its metadata")
sm = alpha.chat.completions.messages.list(stored.id)
check([m.content for m in sm.data] == [m["content"] for m in msgs("Hi.")], "stored completion's messages")
parts = []
for ch in alpha.chat.completions.create(model="m", messages=msgs("Hi again."), max_tokens=4, stream=True,
                                        store=True, metadata={"run": "8"}):
    parts.append(ch)
sid = parts[0].id
text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
check(alpha.chat.completions.retrieve(sid).choices[0].message.content == text,
      "a streamed completion is stored whole")
listed = alpha.chat.completions.list(metadata={"run": "8"})
check([c.id for c in listed.data] == [sid], "list filters by metadata")
try:
    client("kb").chat.completions.retrieve(sid)
    check(False, "another tenant cannot retrieve a stored completion")
except openai.NotFoundError:
    check(True, "another tenant cannot retrieve a stored completion")
check(alpha.chat.completions.delete(sid).deleted, "delete a stored completion")
rr = alpha.responses.with_raw_response.create(model="m", input="Hi.", max_output_tokens=4,
                                              truncation="auto", max_tool_calls=4,
                                              extra_body={"reasoning": {"effort": "low"}})
check(rr.parse().truncation == "auto" and "reasoning" in rr.headers.get("x-agentkv-ignored-fields", ""),
      "Responses: truncation and max_tool_calls honoured, reasoning accepted and named as ignored")
# Context overflow in OpenAI's words and code.
try:
    alpha.chat.completions.create(model="m", messages=msgs("word " * 9000), max_tokens=4)
    check(False, "an overlong prompt refused")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded" and "maximum context length" in str(e),
          f"context overflow: {e.code} {str(e)[:80]}")

kinds, deltas, final = [], [], None
for ev in alpha.responses.create(model="m", input="Count to three.", max_output_tokens=16, temperature=0,
                                 stream=True):
    kinds.append(ev.type)
    if ev.type == "response.output_text.delta":
        deltas.append(ev.delta)
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check(kinds[0] == "response.created" and "response.output_text.done" in kinds and final is not None and
      final.output_text == "".join(deltas), f"responses streaming: {len(kinds)} typed events")
got = alpha.responses.retrieve(final.id)
check(got.id == final.id and got.output_text == final.output_text, "responses.retrieve")
alpha.responses.delete(final.id)
try:
    alpha.responses.retrieve(final.id)
    check(False, "deleted response gone")
except openai.NotFoundError:
    check(True, "responses.delete, then retrieve gets 404")
try:
    beta.responses.retrieve(rt.id)
    check(False, "other tenant's response hidden")
except openai.NotFoundError:
    check(True, "another tenant cannot retrieve the response")
try:
    alpha.responses.create(model="m", input="Hi", extra_body={"frobnicate": 1})
    check(False, "unknown responses field refused")
except openai.BadRequestError as e:
    check(e.param == "frobnicate", "responses: unknown field gets 400 naming it")

# Warm-up prompts are pinned per tenant and reported.
pinned = {(p["name"], p["tenant"]) for p in stats()["pinned_prompts"] if p["pinned_tokens"] > 0}
check({("system", "alpha"), ("system", "beta")} <= pinned, "warm-up prompt pinned for each tenant")

# A repeated prefix: cached_tokens > 0 and equal to the engine's per-tenant counter.
prompt = msgs("List three steps to debug a failing unit test in a Rust project, briefly.")
first = alpha.chat.completions.create(model="m", messages=prompt, max_tokens=4, temperature=0)
before = tenant_hits("alpha")
second = alpha.chat.completions.create(model="m", messages=prompt, max_tokens=4, temperature=0)
cached = second.usage.prompt_tokens_details.cached_tokens
check(cached > 0, f"repeated prefix reuses the cache ({cached} tokens)")
check(tenant_hits("alpha") - before == cached, "cached_tokens equals the engine's hit-token counter")
check(first.choices[0].message.content == second.choices[0].message.content, "greedy output same with cache")

# Tenant isolation: same prompt under another key reuses nothing beyond its own warm-up pin...
iso = msgs("A prompt only alpha has sent before: describe the layout of a Cargo workspace.")
a1 = alpha.chat.completions.create(model="m", messages=iso, max_tokens=2, temperature=0)
b1 = beta.chat.completions.create(model="m", messages=iso, max_tokens=2, temperature=0,
                                  extra_body={"cache_salt": ""})
a2 = alpha.chat.completions.create(model="m", messages=iso, max_tokens=2, temperature=0)
pin = a1.usage.prompt_tokens_details.cached_tokens  # alpha's warm-up prefix only
check(b1.usage.prompt_tokens_details.cached_tokens == pin, "other tenant: only its own warm-up prefix")
check(a2.usage.prompt_tokens_details.cached_tokens > pin, "positive control: same tenant reuses more")
plain = [{"role": "user", "content": "No system prompt here, just a question about caches and keys."}]
alpha.chat.completions.create(model="m", messages=plain, max_tokens=2, temperature=0)
b2 = beta.chat.completions.create(model="m", messages=plain, max_tokens=2, temperature=0)
check(b2.usage.prompt_tokens_details.cached_tokens == 0, "same prompt under another key: 0 cached")
try:
    client("wrong").chat.completions.create(model="m", messages=plain, max_tokens=2)
    check(False, "bad key refused")
except openai.AuthenticationError:
    check(True, "bad key gets 401")

# Agent-session cache controls through the SDK (docs/sessions.md): a cache_control breakpoint on
# the system message, prompt_cache_key, and the fields usage reports.
sys_text = "You are a careful agent. " + " ".join(f"rule {i}: check the cache key {i}." for i in range(40))
def agent_call(user, key="sdk-agent"):
    return alpha.chat.completions.create(
        model="m", max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": [{"type": "text", "text": sys_text,
                   "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
                  {"role": "user", "content": user}],
        extra_body={"prompt_cache_key": key})
c1 = agent_call("First step?")
# The SDK's own field (issue #45): prompt tokens written to the retained cache, never more than
# the prompt.
created = c1.usage.prompt_tokens_details.cache_write_tokens
check(created is not None and 16 <= created <= c1.usage.prompt_tokens,
      f"cache_write_tokens reported by the SDK ({created} of {c1.usage.prompt_tokens})")
c2 = agent_call("Second step?")
cached = c2.usage.prompt_tokens_details.cached_tokens
check(cached is not None and cached >= 16, f"the marked system prefix is reused ({cached})")
sess = json.loads(get("/v1/sessions/sdk-agent", "ka"))
check(sess["object"] == "session" and sess["retained_tokens"] > 0, f"GET /v1/sessions: {sess}")
tiers = sess["blocks_by_tier"]
check(tiers["active"] == sess["retained_blocks"] and tiers["active"] > 0
      and all(tiers[k] == 0 for k in ("ram", "disk", "redis", "none")) and 0 < sess["ttl_left_s"] <= 3600,
      f"the session's blocks by tier, all active, and its TTL left: {sess}")
# A request priority (vLLM's convention) and the x-session-id header, both through the SDK.
r = alpha.chat.completions.create(
    model="m", max_tokens=2, temperature=0,
    messages=[{"role": "system", "content": [{"type": "text", "text": sys_text,
               "cache_control": {"type": "ephemeral", "ttl": "5m"}}]},
              {"role": "user", "content": "Third step?"}],
    extra_headers={"x-session-id": "sdk-header"}, extra_body={"priority": 5})
check(r.usage.prompt_tokens_details.cached_tokens >= 16, "priority + x-session-id call reuses the prefix")
hs = json.loads(get("/v1/sessions/sdk-header", "ka"))
check(hs["priority"] == 5 and 0 < hs["ttl_left_s"] <= 300, f"the header names the session, with its priority: {hs}")
try:
    alpha.chat.completions.create(model="m", max_tokens=1, messages=plain, extra_body={"priority": 1000})
    check(False, "out-of-range priority refused")
except openai.BadRequestError as e:
    check(e.param == "priority", f"out-of-range priority is a 400 naming priority ({e.param})")
try:
    get("/v1/sessions/sdk-header", "kb")
    check(False, "another tenant cannot see the session")
except urllib.error.HTTPError as e:
    check(e.code == 404, f"another tenant's GET of the session is a 404 ({e.code})")
req = urllib.request.Request(BASE + "/v1/sessions/sdk-header", method="DELETE")
req.add_header("Authorization", "Bearer ka")
with urllib.request.urlopen(req, timeout=30) as resp:
    gone = json.loads(resp.read().decode())
check(gone["deleted"] and gone["released_tokens"] > 0, f"DELETE releases the session: {gone}")
try:
    get("/v1/sessions/sdk-header", "ka")
    check(False, "a released session retains nothing")
except urllib.error.HTTPError as e:
    check(e.code == 404, f"GET after DELETE is a 404 ({e.code})")
try:
    alpha.chat.completions.create(model="m", max_tokens=1, messages=plain,
                                  extra_body={"cache_control": {"type": "ephemeral", "ttl": "2d"}})
    check(False, "bad cache_control ttl refused")
except openai.BadRequestError as e:
    check(e.param == "cache_control.ttl", f"bad ttl is a 400 naming cache_control.ttl ({e.param})")

# Streaming with usage.
chunks = list(alpha.chat.completions.create(model="m", messages=msgs("Count to five."), max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(len(text) > 0 and chunks[-1].usage.completion_tokens == 10, "streaming with include_usage")
check(chunks[-1].usage.prompt_tokens_details.cached_tokens > 0, "stream usage reports cached tokens")

# Stop strings, n=2, logprobs, vLLM extras.
r = alpha.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
check("7" not in r.choices[0].text and r.choices[0].finish_reason == "stop", "stop string")
r = alpha.chat.completions.create(model="m", messages=msgs("Name a color."), max_tokens=6, n=2,
                                  temperature=0.8, seed=7, logprobs=True, top_logprobs=2,
                                  extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1})
check(len(r.choices) == 2 and r.usage.completion_tokens == sum(
    len(c.logprobs.content) for c in r.choices), "n=2 with per-token logprobs")
check(all(len(t.top_logprobs) == 2 for c in r.choices for t in c.logprobs.content), "top_logprobs=2")

# Disconnect mid-stream frees the request's blocks.
base_in_use = stats()["blocks"]["in_use"]
stream = alpha.chat.completions.create(model="m", messages=msgs("Write a long story."), max_tokens=400,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
for i, _ in enumerate(stream):
    if i == 3:
        break
check(stats()["blocks"]["in_use"] > base_in_use, "blocks held while streaming")
stream.close()
deadline = time.time() + 10
while time.time() < deadline and (stats()["blocks"]["in_use"] > base_in_use or stats()["num_running"] > 0):
    time.sleep(0.05)
s = stats()
check(s["blocks"]["in_use"] == base_in_use and s["num_running"] == 0, "disconnect frees the blocks")

# Overload: 2 per tenant (429), 3 overall (503), with Retry-After.
def hold(c):
    s = c.chat.completions.create(model="m", messages=msgs("Keep talking."), max_tokens=300,
                                  stream=True, extra_body={"ignore_eos": True})
    next(iter(s))
    return s

held = [hold(alpha), hold(alpha)]
try:
    alpha.chat.completions.create(model="m", messages=plain, max_tokens=2)
    check(False, "third alpha request refused")
except openai.RateLimitError as e:
    check(e.response.headers.get("retry-after") is not None, "tenant over its bound gets 429 + Retry-After")
held.append(hold(beta))
try:
    beta.chat.completions.create(model="m", messages=plain, max_tokens=2)
    check(False, "fourth request refused")
except openai.InternalServerError as e:
    check(e.status_code == 503 and e.response.headers.get("retry-after"), "server over its bound gets 503")
for s in held:
    s.close()
deadline = time.time() + 10
while time.time() < deadline and stats()["num_running"] > 0:
    time.sleep(0.05)
r = alpha.chat.completions.create(model="m", messages=plain, max_tokens=2)
check(r.usage.completion_tokens == 2, "capacity returns after the streams close")

metrics = get("/metrics", "admin")
check('agentkv_tenant_prefix_cache_hit_tokens_total{tenant="alpha"}' in metrics, "per-tenant metrics")
# Anonymous scrapes of a server with tenants see totals only (issue #44, F8).
check("tenant=" not in get("/metrics"), "anonymous /metrics has no tenant labels")
print("ALL E2E CHECKS PASSED")
