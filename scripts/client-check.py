#!/usr/bin/env python3
"""Drives `coil serve` with the official `openai` and `anthropic` Python
clients and checks what they get back: chat (whole, streamed), `parse()`
with a Pydantic schema, tools with `tool_choice="required"`, logprobs,
`n=3`, completions, Anthropic Messages with tools (whole, streamed,
count_tokens), OpenAI Responses with a function tool (whole, streamed),
structured outputs in every dialect (`responses.parse(text_format=...)`,
`text.format` json_object, Anthropic `messages.parse(output_format=...)`,
`output_config.format`, streamed), and errors in each API's shape (a bad
schema: a 400 naming its path).

    # against a running server
    python3 scripts/client-check.py --base-url http://127.0.0.1:8080
    # or start one (and stop it after)
    python3 scripts/client-check.py --serve models/shakespeare-hybrid-q8_0.gguf \
        [--coil target/release/coil] [--parallel 4]

Needs `pip install openai anthropic pydantic` (checked with openai 2.x/3.x
and anthropic 0.x/2.x). Each check prints PASS, FAIL or SKIP (a feature the
server or the model refuses with a 400 naming it, e.g. a forced tool call on
a model whose chat template has no tool-call syntax, as the demo model's)
and what came back; the exit status is the number of failures.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from typing import Literal

import anthropic
import openai
import pydantic

RESULTS = []


def report(name, status, detail=""):
    RESULTS.append((name, status))
    detail = detail if len(detail) < 400 else detail[:400] + "…"
    print(f"{status:4}  {name}: {detail}", flush=True)


def check(name):
    """Runs the decorated check now; an exception is a FAIL, a 400 that
    names a field the server does not implement is a SKIP."""

    def run(fn):
        try:
            detail = fn()
            report(name, "PASS", detail or "")
        except (openai.BadRequestError, anthropic.BadRequestError) as e:
            msg = str(e)
            if ("not supported" in msg or "unsupported field" in msg
                    or "shows no tool-call format" in msg):
                report(name, "SKIP", f"refused by the server: {msg}")
            else:
                report(name, "FAIL", f"400: {msg}")
        except Exception as e:  # noqa: BLE001 - any failure is reported
            report(name, "FAIL", f"{type(e).__name__}: {e}")
            traceback.print_exc(limit=2)
        return fn

    return run


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    port = free_port()
    cmd = [args.coil, "serve", "-m", args.serve, "--port", str(port),
           "--parallel", str(args.parallel), "--ctx", str(args.ctx)]
    print("starting:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"coil serve exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("coil serve did not answer /health in 2 minutes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--serve", metavar="MODEL.gguf", help="start coil serve on this model")
    ap.add_argument("--coil", default="target/release/coil", help="the coil binary (with --serve)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--model", default="coil", help="the model name sent in requests")
    ap.add_argument("--api-key", default=os.environ.get("COIL_API_KEY", "none"))
    args = ap.parse_args()
    if not args.base_url and not args.serve:
        ap.error("give --base-url or --serve")
    proc = None
    base = args.base_url
    if args.serve:
        proc, base = start_server(args)
    try:
        run_checks(base.rstrip("/"), args)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    fails = sum(1 for _, s in RESULTS if s == "FAIL")
    skips = sum(1 for _, s in RESULTS if s == "SKIP")
    print(f"\nopenai {openai.__version__}, anthropic {anthropic.__version__}: "
          f"{len(RESULTS) - fails - skips} passed, {skips} skipped, {fails} failed")
    sys.exit(fails)


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


# Bounded: a tiny model may not end a free string by itself within the
# checks' token limits (the constraint holds it to the bound).
class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    age: int = pydantic.Field(ge=0, le=150)


# The anthropic package moves string bounds into descriptions (its API
# does not take them): literals and booleans only.
class Verdict(pydantic.BaseModel):
    mood: Literal["merry", "sad"]
    sunny: bool


# A schema with a fault at properties.age.type.
BAD_SCHEMA = {"type": "object", "properties": {"age": {"type": "integr"}}}


def run_checks(base, args):
    oa = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key)
    an = anthropic.Anthropic(base_url=base, api_key=args.api_key)
    model = args.model
    hello = [{"role": "user", "content": "Say hello."}]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}}]

    @check("chat")
    def _():
        r = oa.chat.completions.create(model=model, messages=hello, max_tokens=16, temperature=0)
        c = r.choices[0]
        expect(r.object == "chat.completion", r.object)
        expect(c.message.role == "assistant", c.message.role)
        expect(r.usage.completion_tokens > 0, r.usage)
        return f"{c.finish_reason}: {c.message.content!r}"

    @check("chat streamed")
    def _():
        parts, finish, usage = [], None, None
        stream = oa.chat.completions.create(
            model=model, messages=hello, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True})
        for ch in stream:
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        expect(finish in ("stop", "length"), finish)
        expect(usage is not None and usage.completion_tokens > 0, usage)
        return f"{len(parts)} chunks, {finish}: {''.join(parts)!r}"

    @check("chat parse() with a Pydantic schema")
    def _():
        r = oa.chat.completions.parse(
            model=model, response_format=Person, max_tokens=64, temperature=0,
            messages=[{"role": "user", "content": "Alice is 30. Give her name and age."}])
        p = r.choices[0].message.parsed
        expect(isinstance(p, Person), p)
        return repr(p)

    @check("tools, tool_choice=required")
    def _():
        r = oa.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools, tool_choice="required", max_tokens=64, temperature=0)
        calls = r.choices[0].message.tool_calls
        expect(calls, "no tool call")
        args_ = json.loads(calls[0].function.arguments)
        expect("city" in args_, args_)
        return f"{calls[0].function.name}({calls[0].function.arguments})"

    @check("tools, tool_choice=auto")
    def _():
        r = oa.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools, max_tokens=32, temperature=0)
        m = r.choices[0].message
        return f"{r.choices[0].finish_reason}: calls {m.tool_calls}, content {m.content!r}"

    @check("chat response_format with a bad schema: 400 naming its path")
    def _():
        try:
            oa.chat.completions.create(
                model=model, messages=hello, max_tokens=4,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": BAD_SCHEMA}})
        except openai.BadRequestError as e:
            err = e.body.get("error", e.body) if isinstance(e.body, dict) else {}
            expect(err.get("message", "").startswith(
                "response_format.json_schema.schema.properties.age.type"), e.body)
            return f"400 {err.get('message')}"
        raise AssertionError("no error for a bad schema")

    @check("logprobs")
    def _():
        r = oa.chat.completions.create(
            model=model, messages=hello, max_tokens=8, temperature=0, logprobs=True,
            top_logprobs=3)
        lp = r.choices[0].logprobs.content
        expect(len(lp) == r.usage.completion_tokens, (len(lp), r.usage))
        expect(all(len(t.top_logprobs) == 3 for t in lp), "top_logprobs")
        expect(all(t.logprob == t.top_logprobs[0].logprob for t in lp), "greedy = top-1")
        return ", ".join(f"{t.token!r} {t.logprob:.2f}" for t in lp[:4])

    @check("n=3")
    def _():
        r = oa.chat.completions.create(
            model=model, messages=hello, max_tokens=12, n=3, temperature=1.0, seed=42)
        expect(len(r.choices) == 3, len(r.choices))
        expect([c.index for c in r.choices] == [0, 1, 2], [c.index for c in r.choices])
        return " | ".join(repr(c.message.content) for c in r.choices)

    @check("completions with logprobs")
    def _():
        r = oa.completions.create(model=model, prompt="To be, or not to be", max_tokens=8,
                                  temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        expect(len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens, lp)
        return repr(r.choices[0].text)

    @check("openai error shape")
    def _():
        try:
            oa.chat.completions.create(model=model, messages=hello, max_tokens=4,
                                       extra_body={"audio": {"voice": "x"}})
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            err = body.get("error", body)
            expect(err.get("param") == "audio", e.body)
            return f"400 {err}"
        raise AssertionError("no error for an unsupported field")

    # anthropic 2.x's methods take no sampling arguments; the API (and coil)
    # still read temperature from the body
    GREEDY = {"temperature": 0}
    an_tools = [{"name": "get_weather", "description": "The weather in a city",
                 "input_schema": WEATHER}]

    @check("anthropic messages")
    def _():
        m = an.messages.create(model=model, max_tokens=16, system="Be brief.", messages=hello,
                               extra_body=GREEDY)
        expect(m.type == "message" and m.role == "assistant", m)
        expect(m.content and m.content[0].type == "text", m.content)
        return f"{m.stop_reason}: {m.content[0].text!r} ({m.usage.output_tokens} tokens)"

    @check("anthropic messages with tools (and a tool_result turn)")
    def _():
        msgs = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]},
        ]
        m = an.messages.create(model=model, max_tokens=24, tools=an_tools, messages=msgs,
                               extra_body=GREEDY)
        kinds = [b.type for b in m.content]
        n = an.messages.count_tokens(model=model, tools=an_tools, messages=msgs).input_tokens
        expect(n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m.usage))
        return f"{m.stop_reason}: blocks {kinds}, count_tokens {n}"

    @check("anthropic messages streamed")
    def _():
        with an.messages.stream(model=model, max_tokens=16, messages=hello, extra_body=GREEDY,
                                tools=an_tools) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        expect(final.content[0].text == text if final.content else text == "", final)
        return f"{final.stop_reason}: {text!r}"

    @check("anthropic messages.parse() with output_format=Pydantic model")
    def _():
        m = an.messages.parse(
            model=model, max_tokens=96, output_format=Verdict, extra_body=GREEDY,
            messages=[{"role": "user", "content": "Is it sunny? Are you merry?"}])
        p = m.parsed_output
        expect(isinstance(p, Verdict), (p, m.content))
        return f"{m.stop_reason}: {p!r}"

    @check("anthropic output_config.format (a schema dict), streamed")
    def _():
        fmt = {"type": "json_schema", "schema": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                             "sunny": {"type": "boolean"}},
            "required": ["city", "sunny"], "additionalProperties": False}}
        with an.messages.stream(model=model, max_tokens=64, extra_body=GREEDY,
                                output_config={"format": fmt},
                                messages=[{"role": "user", "content": "Weather in Paris?"}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        v = json.loads(text)
        expect(set(v) == {"city", "sunny"} and isinstance(v["sunny"], bool), v)
        return f"{final.stop_reason}: {text}"

    @check("anthropic output_config.format with a bad schema: 400 naming its path")
    def _():
        try:
            an.messages.create(model=model, max_tokens=4, messages=hello,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": BAD_SCHEMA}})
        except anthropic.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            expect(body.get("type") == "error", e.body)
            expect(body["error"]["type"] == "invalid_request_error", e.body)
            expect(body["error"]["message"].startswith(
                "output_config.format.schema.properties.age.type"), e.body)
            return f"400 {body['error']['message']}"
        raise AssertionError("no error for a bad schema")

    @check("anthropic error shape")
    def _():
        try:
            an.messages.create(model=model, max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        except anthropic.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            expect(body.get("type") == "error", e.body)
            expect(body["error"]["type"] == "invalid_request_error", e.body)
            return f"400 {body}"
        raise AssertionError("no error for an image block")

    fn_tool = [{"type": "function", "name": "get_weather",
                "description": "The weather in a city", "parameters": WEATHER}]

    @check("responses with a function tool")
    def _():
        r = oa.responses.create(model=model, instructions="Be brief.", input="Weather in Paris?",
                                tools=fn_tool, max_output_tokens=24, temperature=0)
        kinds = [o.type for o in r.output]
        return f"{r.status}: items {kinds}, output_text {r.output_text!r}"

    @check("responses with a function call output")
    def _():
        r = oa.responses.create(model=model, tools=fn_tool, max_output_tokens=16, temperature=0,
                                input=[
                                    {"role": "user", "content": "Weather in Paris?"},
                                    {"type": "function_call", "call_id": "c1",
                                     "name": "get_weather", "arguments": '{"city": "Paris"}'},
                                    {"type": "function_call_output", "call_id": "c1",
                                     "output": "18 C, sunny"}])
        return f"{r.status}: {r.output_text!r}"

    @check("responses.parse() with text_format=Pydantic model")
    def _():
        r = oa.responses.parse(
            model=model, input="Alice is 30. Give her name and age.", text_format=Person,
            max_output_tokens=96, temperature=0)
        p = r.output_parsed
        expect(isinstance(p, Person), (p, r.output_text))
        expect(r.text.format.type == "json_schema", r.text)
        return f"{r.status}: {p!r}"

    @check("responses text.format json_object, streamed")
    def _():
        text, last = [], None
        for ev in oa.responses.create(model=model, input="Describe Paris as JSON.",
                                      max_output_tokens=160, temperature=0, stream=True,
                                      text={"format": {"type": "json_object"}}):
            last = ev
            if ev.type == "response.output_text.delta":
                text.append(ev.delta)
        if last.type == "response.completed":
            expect(isinstance(json.loads("".join(text)), dict), "".join(text))
        else:
            expect(last.type == "response.incomplete", last.type)
        return f"{last.type}: {''.join(text)!r}"

    @check("responses text.format with a bad schema: 400 naming its path")
    def _():
        try:
            oa.responses.create(model=model, input="Hi", max_output_tokens=4,
                                text={"format": {"type": "json_schema", "name": "x",
                                                 "schema": BAD_SCHEMA}})
        except openai.BadRequestError as e:
            err = e.body.get("error", e.body) if isinstance(e.body, dict) else {}
            expect(err.get("param") == "text.format", e.body)
            expect(err.get("message", "").startswith("text.format.schema.properties.age.type"),
                   e.body)
            return f"400 {err.get('message')}"
        raise AssertionError("no error for a bad schema")

    @check("responses streamed")
    def _():
        kinds, text = [], []
        for ev in oa.responses.create(model=model, input="Say hello.", max_output_tokens=16,
                                      temperature=0, stream=True):
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text.append(ev.delta)
        expect(kinds[0] == "response.created", kinds[:2])
        expect(kinds[-1] in ("response.completed", "response.incomplete"), kinds[-1])
        return f"{len(kinds)} events ({kinds[-1]}): {''.join(text)!r}"


if __name__ == "__main__":
    main()
