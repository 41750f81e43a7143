#!/usr/bin/env python3
"""Reference renders of real chat templates, for coil-server's template tests.

Run by hand (the outputs are committed):

    python3 tools/make_template_fixtures.py --llama-cpp PATH [--out DIR]

`--llama-cpp` is a llama.cpp source tree (its `models/templates/` holds chat
templates copied from the models' Hugging Face repositories); `--out`
defaults to tests/fixtures/templates/ under the repository root.

For every template of the families coil runs or is adding (Granite 3.x /
4.x, Nemotron Nano v2 / 3, Qwen2.5 / Qwen3 / QwQ / Qwen3.5 / Qwen3-Coder,
LFM2 / LFM2.5, Ling 3.0 (Bailing-Hybrid); llama.cpp has none for Falcon-H1,
Jamba or Kimi-Linear) this script

1. copies the template into `--out` (`<name>.jinja`);
2. renders every case of CASES below with transformers' own chat-template
   renderer (`transformers.utils.chat_template_utils.render_jinja_template`,
   what `tokenizer.apply_chat_template(..., tokenize=False)` calls), with
   `bos_token` / `eos_token` as the model's tokenizer has them and
   `strftime_now` reading a fixed clock (FIXED_NOW);
3. writes `renders.json`: the cases (messages as transformers takes them:
   tool-call `arguments` as objects), and per template and case either
   `{"prompt": TEXT}` or `{"error": MESSAGE}` where transformers itself
   rejects the case (the template raised, or Jinja failed).

Needs transformers (5.x) and jinja2 >= 3.1.6; no model is downloaded.
"""

import argparse
import datetime as _dt
import json
import shutil
from pathlib import Path

import transformers
from transformers.utils import chat_template_utils

# The clock strftime_now reads (UTC): 2026-03-14 09:26:53, a Saturday.
FIXED_NOW = _dt.datetime(2026, 3, 14, 9, 26, 53)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


# strftime_now is a closure over the module's `datetime` name.
chat_template_utils.datetime = _FixedDatetime

# name in llama.cpp's models/templates, bos_token, eos_token (the texts the
# models' tokenizer_config.json has).
TEMPLATES = [
    ("ibm-granite-granite-3.3-2B-Instruct", "<|end_of_text|>", "<|end_of_text|>"),
    ("ibm-granite-granite-4.0", "<|end_of_text|>", "<|end_of_text|>"),
    ("ibm-granite-granite-4.1", "<|end_of_text|>", "<|end_of_text|>"),
    ("NVIDIA-Nemotron-Nano-v2", "<SPECIAL_10>", "<SPECIAL_12>"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "<s>", "<|im_end|>"),
    ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>"),
    ("Qwen-QwQ-32B", "", "<|im_end|>"),
    ("Qwen3-Coder", "", "<|im_end|>"),
    ("Qwen3.5-4B", "", "<|im_end|>"),
    ("LFM2-8B-A1B", "<|startoftext|>", "<|im_end|>"),
    ("LFM2.5-8B-A1B", "<|startoftext|>", "<|im_end|>"),
    ("LFM2.5-Instruct", "<|startoftext|>", "<|im_end|>"),
    # Bailing-Hybrid (Ling 3.0): the template reads neither token.
    ("inclusionai-ling-3.0-flash", "", ""),
]

SYSTEM = {"role": "system", "content": "You are a concise assistant."}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.\n",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web <html> & \"quotes\".",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "recent": {"type": "boolean"}},
                },
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}

TOOLS = [WEATHER, SEARCH]


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CALL_WEATHER = call("call_1", "get_weather", {"city": "Paris", "unit": "celsius", "days": 2})
CALL_SEARCH = call(
    "call_2",
    "search",
    {
        "query": "coil inference",
        "filters": {"site": "github.com", "recent": True},
        "tags": ["rust", "ssm"],
        "limit": 2.5,
        "page": None,
    },
)

# name -> (messages, tools, extra template kwargs, add_generation_prompt)
CASES = {
    "plain": (
        [SYSTEM, {"role": "user", "content": "Hi!"},
         {"role": "assistant", "content": "Hello. How can I help?"},
         {"role": "user", "content": "Name a prime."}],
        None, {}, True,
    ),
    "no_system": ([{"role": "user", "content": "Hi!"}], None, {}, True),
    "multi_turn": (
        [{"role": "user", "content": "One?"}, {"role": "assistant", "content": "1"},
         {"role": "user", "content": "Two?"}, {"role": "assistant", "content": "2"},
         {"role": "user", "content": "Three?"}],
        None, {}, True,
    ),
    "no_generation_prompt": (
        [SYSTEM, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}],
        None, {}, False,
    ),
    "unicode": (
        [{"role": "system", "content": "  Réponds en français. 日本語もOK.  "},
         {"role": "user", "content": "Tab\there, <b>bold</b> & \"quote\" 'single' \\ back 😀\n"}],
        None, {}, True,
    ),
    "tools": ([SYSTEM, {"role": "user", "content": "Weather in Paris?"}], TOOLS, {}, True),
    "tools_no_system": ([{"role": "user", "content": "Weather in Paris?"}], TOOLS, {}, True),
    "tool_call_history": (
        [SYSTEM, {"role": "user", "content": "Weather in Paris, and news about coil?"},
         {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER, CALL_SEARCH]},
         {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18, \"sky\": \"clear\"}"},
         {"role": "tool", "tool_call_id": "call_2", "content": "No results."},
         {"role": "assistant", "content": "It is 18 °C and clear in Paris; no news."},
         {"role": "user", "content": "Thanks!"}],
        TOOLS, {}, True,
    ),
    "tool_call_with_content": (
        [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL_WEATHER]},
         {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
        TOOLS, {}, True,
    ),
    "tool_call_last": (
        [{"role": "user", "content": "Search coil."},
         {"role": "assistant", "content": "", "tool_calls": [CALL_SEARCH]}],
        TOOLS, {}, False,
    ),
    "reasoning_content": (
        [{"role": "user", "content": "2+2?"},
         {"role": "assistant", "reasoning_content": "Two plus two is four.", "content": "4"},
         {"role": "user", "content": "3+3?"}],
        None, {}, True,
    ),
    "reasoning_last_turn": (
        [{"role": "user", "content": "2+2?"},
         {"role": "assistant", "reasoning_content": "\nTwo plus two.\n", "content": "4"}],
        None, {}, False,
    ),
    "reasoning_with_tool_call": (
        [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "reasoning_content": "I need the tool.", "content": "",
          "tool_calls": [CALL_WEATHER]},
         {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
        TOOLS, {}, True,
    ),
    "think_in_content": (
        [{"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
         {"role": "user", "content": "And 3+3?"}],
        None, {}, True,
    ),
    "thinking_on": ([{"role": "user", "content": "Hi!"}], None, {"enable_thinking": True}, True),
    "thinking_off": ([{"role": "user", "content": "Hi!"}], None, {"enable_thinking": False}, True),
    "thinking_off_with_tools": (
        [SYSTEM, {"role": "user", "content": "Weather?"}], TOOLS, {"enable_thinking": False}, True,
    ),
    "keep_thinking_kwargs": (
        [{"role": "user", "content": "2+2?"},
         {"role": "assistant", "reasoning_content": "Add.", "content": "<think>Add.</think>4"},
         {"role": "user", "content": "3+3?"}],
        None,
        {"keep_past_thinking": True, "preserve_thinking": True,
         "truncate_history_thinking": False, "thinking": True},
        True,
    ),
    "no_think_flag": (
        [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}],
        None, {}, True,
    ),
    "system_only": ([SYSTEM], None, {}, True),
}


def render(source, bos, eos, messages, tools, kwargs, agp):
    out, _ = chat_template_utils.render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=source,
        add_generation_prompt=agp,
        bos_token=bos,
        eos_token=eos,
        **kwargs,
    )
    return out[0]


def main():
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="a llama.cpp source tree")
    ap.add_argument("--out", type=Path, default=root / "tests/fixtures/templates")
    a = ap.parse_args()
    src_dir = a.llama_cpp / "models/templates"
    a.out.mkdir(parents=True, exist_ok=True)

    cases = {
        name: {"messages": m, "tools": t, "kwargs": k, "add_generation_prompt": agp}
        for name, (m, t, k, agp) in CASES.items()
    }
    templates = {}
    for name, bos, eos in TEMPLATES:
        src = src_dir / f"{name}.jinja"
        shutil.copyfile(src, a.out / f"{name}.jinja")
        source = src.read_text(encoding="utf-8")
        results = {}
        for case, (m, t, k, agp) in CASES.items():
            try:
                results[case] = {"prompt": render(source, bos, eos, m, t, k, agp)}
            except Exception as e:  # the template's own error, or Jinja's
                results[case] = {"error": f"{type(e).__name__}: {e}"}
        n_err = sum("error" in r for r in results.values())
        print(f"{name}: {len(results) - n_err} rendered, {n_err} errors")
        templates[name] = {"bos_token": bos, "eos_token": eos, "results": results}

    doc = {
        "generator": "tools/make_template_fixtures.py",
        "transformers": transformers.__version__,
        "now": FIXED_NOW.strftime("%Y-%m-%dT%H:%M:%S"),
        "cases": cases,
        "templates": templates,
    }
    with open(a.out / "renders.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
