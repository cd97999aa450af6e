"""instructor against a running `agentkv serve` (default model): `Iterable[...]` of a nested
pydantic model through tool calls (instructor's default TOOLS mode; its schema has
`$defs`/`$ref`) — issue #45's framework matrix. Runs in its own venv (instructor pins an older
openai than the other clients). Usage: e2e_instructor.py BASE_URL; the server serves
"agentkv-e2e" without API keys. Exits non-zero with a message on a failed check.
"""
import sys
from typing import Iterable

import instructor
import openai
from pydantic import BaseModel, Field

BASE = sys.argv[1]


class Address(BaseModel):
    city: str = Field(max_length=20)


class User(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    address: Address


client = instructor.from_openai(openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0))
users = list(client.chat.completions.create(
    model="agentkv-e2e", response_model=Iterable[User], max_retries=0, temperature=0, max_tokens=300,
    messages=[{"role": "user", "content": "Ann is 31 and lives in Paris; Bob is 40 and lives in Rome."}]))
if not users or not all(isinstance(u, User) and isinstance(u.address, Address) for u in users):
    sys.exit(f"FAILED: instructor Iterable[User] gave {users!r}")
print(f"ok: instructor Iterable[User] (nested Address): {users!r}")
print("ALL INSTRUCTOR CHECKS PASSED")
