#!/usr/bin/env python3
"""Classify BFCL (FC mode) failures into server-caused and model-caused.

Run it with the Python of the venv that has `bfcl-eval` and `jsonschema` (see run.sh):

    classify.py --bfcl-root RUN_DIR [--raw-log proxy.jsonl] [--label NAME]
                [--model gpt-4o-2024-11-20-FC] [--categories simple_python,...] [--json out.json]

RUN_DIR is the BFCL_PROJECT_ROOT of one run: it reads BFCL's raw model responses from
RUN_DIR/result/MODEL/non_live/BFCL_v4_<cat>_result.json, BFCL's AST-checker verdicts from
RUN_DIR/score/MODEL/non_live/BFCL_v4_<cat>_score.json and the questions (with their function
schemas) from the installed bfcl_eval package. --raw-log is the optional JSONL written by the
recording proxy in run.sh (raw HTTP status/body per request); it only adds detail (finish
status, raw text) to the report, the classification itself uses BFCL's files.

Every question is checked; every question BFCL scores wrong gets exactly one class:

  server-caused (first that applies):
    http_error            BFCL stored "Error during inference: ..." (HTTP error status / transport)
    tool_json_in_content  no function call, but the text holds tool-call JSON
    no_tool_call          no function call although the category requires one
    unparseable_args      a call's arguments are not JSON (or not a JSON object)
    unknown_function      a call names a function that was not offered
    schema_unknown_param  arguments name a parameter the function does not declare
    schema_violation      arguments do not validate against the function's parameter schema
                          (BFCL type names dict/float/tuple/any/... mapped to JSON Schema)
  model-caused:
    call_on_irrelevance   irrelevance question answered with (valid) call(s)
    ast:<error_type>      valid call(s) that BFCL's AST checker scores wrong

Questions BFCL scores right but that show a server-caused problem (e.g. an HTTP error on an
irrelevance question counts as "no call" = pass) are listed separately, not counted as failures.
"""
import argparse
import json
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import jsonschema

import bfcl_eval
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
SERVER_KINDS = [
    "http_error",
    "tool_json_in_content",
    "no_tool_call",
    "unparseable_args",
    "unknown_function",
    "schema_unknown_param",
    "schema_violation",
]
DATA_DIR = Path(bfcl_eval.__file__).resolve().parent / "data"


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def to_json_schema(s):
    """BFCL parameter schema -> JSON Schema (type names via BFCL's own GORILLA_TO_OPENAPI)."""
    if isinstance(s, list):
        return [to_json_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k == "type" and isinstance(v, str):
            out[k] = GORILLA_TO_OPENAPI.get(v, v)
        elif k == "type" and isinstance(v, list):
            out[k] = [GORILLA_TO_OPENAPI.get(t, t) for t in v]
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: to_json_schema(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "not"):
            out[k] = to_json_schema(v)
        elif k in ("optional", "format"):
            continue  # BFCL annotations, not JSON Schema assertions
        else:
            out[k] = v
    return out


def function_table(functions):
    """name as sent to the server (dots -> underscores, as BFCL does for OpenAI) -> schemas."""
    table = {}
    for fn in functions:
        sent_name = re.sub(r"\.", "_", fn["name"])
        params = to_json_schema(fn.get("parameters", {}))
        params["type"] = "object"
        strict = dict(params)
        strict["additionalProperties"] = False
        table[sent_name] = (params, strict)
        table.setdefault(fn["name"], (params, strict))
    return table


def find_tool_json(text, names):
    """Return a short description of tool-call JSON found in `text`, or None."""
    if "<tool_call>" in text or "<|tool_call" in text or "[TOOL_CALLS]" in text:
        return "tool-call tag in text"
    dec = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            obj, _ = dec.raw_decode(text[m.start():])
        except ValueError:
            continue
        items = obj if isinstance(obj, list) else [obj]
        for it in items:
            if not isinstance(it, dict):
                continue
            if "tool_calls" in it or "tool_call" in it:
                return "JSON with tool_call(s) key"
            fn = it.get("function") if isinstance(it.get("function"), dict) else it
            if "name" in fn and ("arguments" in fn or "parameters" in fn):
                return f"JSON call object name={fn.get('name')!r}"
            if len(it) == 1 and next(iter(it)) in names:
                return f"JSON {{name: args}} for {next(iter(it))!r}"
    return None


def check_calls(calls, table):
    """Server-level checks of a list of {name: argument-string} calls. -> (kind, detail) or None."""
    for call in calls:
        if not isinstance(call, dict) or len(call) != 1:
            return "unparseable_args", f"call entry is not {{name: args}}: {str(call)[:200]}"
        name, raw = next(iter(call.items()))
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except (ValueError, TypeError) as e:
            return "unparseable_args", f"{name}: {e}: {str(raw)[:200]!r}"
        if not isinstance(args, dict):
            return "unparseable_args", f"{name}: arguments are {type(args).__name__}, not an object: {str(raw)[:200]!r}"
        if name not in table:
            return "unknown_function", f"{name!r} not in {sorted(set(table))}"
        params, strict = table[name]
        try:
            jsonschema.validate(args, params)
        except jsonschema.ValidationError as e:
            path = "/".join(str(p) for p in e.absolute_path) or "(root)"
            return "schema_violation", f"{name}: {path}: {e.message[:200]}"
        except jsonschema.SchemaError as e:
            return "schema_violation", f"{name}: function schema itself invalid: {e.message[:120]}"
        try:
            jsonschema.validate(args, strict)
        except jsonschema.ValidationError as e:
            return "schema_unknown_param", f"{name}: {e.message[:200]}"
    return None


def raw_log_index(path):
    """proxy JSONL -> {(input-json, tool names): last record}."""
    idx = {}
    if not path or not os.path.exists(path):
        return idx
    for rec in load_jsonl(path):
        req = rec.get("request") or {}
        if not isinstance(req, dict):
            continue
        msgs = req.get("input", req.get("messages"))
        tools = tuple(t.get("name") or (t.get("function") or {}).get("name") for t in req.get("tools") or [])
        idx[(norm_msgs(msgs), tools)] = rec
    return idx


def norm_msgs(msgs):
    if isinstance(msgs, list):
        msgs = [{"role": "system" if m.get("role") == "developer" else m.get("role"), "content": m.get("content")}
                for m in msgs if isinstance(m, dict)]
    return json.dumps(msgs, sort_keys=True)


def raw_detail(rec):
    if not rec:
        return ""
    status = rec.get("status")
    body = rec.get("response")
    if not isinstance(body, dict):
        return f" [raw: HTTP {status} {str(body)[:200]!r}]"
    bits = [f"HTTP {status}"]
    if "status" in body:
        bits.append(f"status={body.get('status')}")
    if body.get("incomplete_details"):
        bits.append(f"incomplete={body['incomplete_details'].get('reason')}")
    ch = body.get("choices")
    if ch:
        bits.append(f"finish_reason={ch[0].get('finish_reason')}")
    usage = body.get("usage") or {}
    ot = usage.get("output_tokens", usage.get("completion_tokens"))
    if ot is not None:
        bits.append(f"output_tokens={ot}")
    if body.get("error"):
        bits.append(f"error={str(body.get('error'))[:200]}")
    return " [raw: " + ", ".join(bits) + "]"


def raw_cut(rec):
    """True when the raw response says generation stopped at the output-token cap."""
    body = (rec or {}).get("response")
    if not isinstance(body, dict):
        return False
    if (body.get("incomplete_details") or {}).get("reason") in ("max_output_tokens", "length"):
        return True
    ch = body.get("choices") or [{}]
    return ch[0].get("finish_reason") == "length"


def classify_run(root, model, categories, raw_log=None):
    root = Path(root)
    rawidx = raw_log_index(raw_log)
    per_cat = {}
    server_rows, passed_server_rows = [], []
    for cat in categories:
        questions = {q["id"]: q for q in load_jsonl(DATA_DIR / f"BFCL_v4_{cat}.json")}
        res_file = root / "result" / model / "non_live" / f"BFCL_v4_{cat}_result.json"
        score_file = root / "score" / model / "non_live" / f"BFCL_v4_{cat}_score.json"
        if not res_file.exists():
            continue
        results = load_jsonl(res_file)
        scores = load_jsonl(score_file) if score_file.exists() else []
        header = scores[0] if scores else {}
        failed = {s["id"]: s for s in scores[1:]}
        c = Counter()
        c["total"] = len(results)
        for r in results:
            qid, result = r["id"], r["result"]
            q = questions[qid]
            table = function_table(q["function"])
            rec = rawidx.get((norm_msgs(q["question"][0]), tuple(re.sub(r"\.", "_", f["name"]) for f in q["function"])))
            kind, detail = None, ""
            if isinstance(result, str):
                if result.startswith("Error during inference"):
                    kind, detail = "http_error", result[:300]
                else:
                    hit = find_tool_json(result, table)
                    if hit:
                        kind, detail = "tool_json_in_content", f"{hit}; text={result[:200]!r}"
                    elif cat != "irrelevance":
                        kind, detail = "no_tool_call", f"text={result[:200]!r}"
            elif isinstance(result, list):
                if not result and cat != "irrelevance":
                    kind, detail = "no_tool_call", "empty call list"
                else:
                    got = check_calls(result, table)
                    if got:
                        kind, detail = got
            else:
                kind, detail = "unparseable_args", f"result of type {type(result).__name__}"
            if kind == "no_tool_call":
                cut = raw_cut(rec)
                sub = ("empty" if not (isinstance(result, str) and result.strip()) else "text") + ("+cut" if cut else "")
                c["no_tool_call:" + sub] += 1
            detail += raw_detail(rec)
            is_failed = qid in failed
            if not is_failed:
                c["pass"] += 1
                if kind:
                    passed_server_rows.append((cat, qid, kind, detail))
                continue
            c["fail"] += 1
            if cat == "irrelevance":
                # BFCL fails an irrelevance question only when it decodes a call: the model chose
                # to call. Calls that also have server-level defects are noted, not re-classed.
                c["model"] += 1
                c["model:call_on_irrelevance"] += 1
                if kind:
                    c["model:call_on_irrelevance(+" + kind + ")"] += 1
            elif kind:
                c["server:" + kind] += 1
                c["server"] += 1
                server_rows.append((cat, qid, kind, detail))
            else:
                et = failed[qid].get("error_type", "?")
                c["model"] += 1
                c["model:ast:" + et] += 1
                keys = [json.dumps({k: json.loads(v) if isinstance(v, str) else v}, sort_keys=True)
                        for call in result for k, v in call.items()]
                if len(keys) != len(set(keys)):
                    c["note:identical_duplicate_calls"] += 1
        c["bfcl_correct"] = header.get("correct_count", c["pass"])
        per_cat[cat] = c
    return per_cat, server_rows, passed_server_rows


def render(label, per_cat, server_rows, passed_server_rows):
    out = []
    w = out.append
    w(f"== classifier: {label} ==")
    hdr = f"{'category':<18} {'total':>5} {'pass':>5} {'acc%':>6} {'fail':>5} {'server':>6} {'model':>6}"
    w(hdr)
    tot = Counter()
    for cat, c in per_cat.items():
        acc = 100.0 * c["pass"] / c["total"] if c["total"] else 0.0
        w(f"{cat:<18} {c['total']:>5} {c['pass']:>5} {acc:>6.1f} {c['fail']:>5} {c['server']:>6} {c['model']:>6}")
        tot.update(c)
    if per_cat:
        acc = 100.0 * tot["pass"] / tot["total"] if tot["total"] else 0.0
        w(f"{'ALL':<18} {tot['total']:>5} {tot['pass']:>5} {acc:>6.1f} {tot['fail']:>5} {tot['server']:>6} {tot['model']:>6}")
    w("")
    w("server-caused failures by kind (per category):")
    for cat, c in per_cat.items():
        kinds = ", ".join(f"{k}={c['server:' + k]}" for k in SERVER_KINDS if c["server:" + k])
        w(f"  {cat:<18} {kinds or '-'}")
    w("model-caused failures by kind (per category):")
    for cat, c in per_cat.items():
        kinds = ", ".join(f"{k[6:]}={v}" for k, v in sorted(c.items()) if k.startswith("model:"))
        w(f"  {cat:<18} {kinds or '-'}")
    w("no_tool_call breakdown (empty = no text at all, text = a plain-text answer, +cut = stopped at the "
      "output-token cap, from the raw log): " + ("; ".join(
        f"{cat}: " + ", ".join(f"{k[13:]}={v}" for k, v in sorted(c.items()) if k.startswith("no_tool_call:"))
        for cat, c in per_cat.items() if c["server:no_tool_call"]) or "-"))
    w("notes on model-caused failures: " + ", ".join(
        f"{cat}: identical duplicate calls in {c['note:identical_duplicate_calls']}" for cat, c in per_cat.items()
        if c["note:identical_duplicate_calls"]) or "-")
    w("")
    w(f"server-caused failures ({len(server_rows)}):")
    for cat, qid, kind, detail in server_rows:
        w(f"  {qid:<22} {kind:<20} {detail}")
    w(f"server-side problems on questions BFCL scored as passed ({len(passed_server_rows)}):")
    for cat, qid, kind, detail in passed_server_rows:
        w(f"  {qid:<22} {kind:<20} {detail}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bfcl-root", required=True)
    ap.add_argument("--model", default="gpt-4o-2024-11-20-FC")
    ap.add_argument("--label", default=None)
    ap.add_argument("--raw-log", default=None)
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--json", default=None, help="also write counts and rows as JSON here")
    a = ap.parse_args()
    cats = [c for c in a.categories.split(",") if c]
    per_cat, rows, prow = classify_run(a.bfcl_root, a.model, cats, a.raw_log)
    print(render(a.label or a.bfcl_root, per_cat, rows, prow))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"per_category": {k: dict(v) for k, v in per_cat.items()},
                       "server_caused": [dict(zip(("category", "id", "kind", "detail"), r)) for r in rows],
                       "server_on_passed": [dict(zip(("category", "id", "kind", "detail"), r)) for r in prow]},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
