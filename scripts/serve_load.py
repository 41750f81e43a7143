#!/usr/bin/env python3
"""Concurrent-client load against an OpenAI-compatible completions server.

    python3 scripts/serve_load.py --url http://127.0.0.1:8080 --clients 1 2 4 8 16 \
        [--max-tokens 128] [--prompt-words 12] [--rounds 1] [--temperature T] \
        [--json] [--out FILE]

For each client count N, N clients each send one streamed /v1/completions
request at the same moment (greedy unless `--temperature`, `ignore_eos`,
`max_tokens` tokens, a short prompt of its own so that no two share a cached
prefix), `--rounds` times.
Printed per N:

- prompt tokens per request (mean, as the server counted them);
- aggregate generated tokens/s: all completion tokens / wall time from the
  first request sent to the last stream closed;
- total tokens/s: prompt and completion tokens / the same wall time;
- TTFT: time from sending a request to its first streamed text (mean, max);
- TPOT: (last text - first text) / (completion tokens - 1), mean over
  requests: the time per output token a client sees while decoding.

Python standard library only, so it runs anywhere (coil serve, llama-server).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request

WORDS = (
    "once upon a time in a land far away there lived a quiet river keeper who "
    "counted every stone along the bank and wrote the numbers in a small book"
).split()


def prompt_for(i: int, words: int) -> str:
    # A distinct first word per client: no shared prefix between clients.
    body = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))
    return f"Story {i}: {body}"


def one_request(
    url: str, prompt: str, max_tokens: int, out: dict, temperature: float = 0.0
) -> None:
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": 1,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "cache_prompt": False,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    first = last = None
    usage = None
    n_chunks = 0
    gap = 0.0
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("usage"):
                    usage = msg["usage"]
                for ch in msg.get("choices") or []:
                    if ch.get("text"):
                        now = time.perf_counter()
                        if last is not None:
                            gap = max(gap, now - last)
                        first = first or now
                        out["first"] = first
                        last = now
                        n_chunks += 1
    except Exception as e:  # noqa: BLE001 - reported, not raised
        out["error"] = str(e)
        return
    out["start"] = t0
    out["end"] = time.perf_counter()
    out["ttft"] = (first or out["end"]) - t0
    n = (usage or {}).get("completion_tokens", n_chunks)
    out["tokens"] = n
    out["prompt_tokens"] = (usage or {}).get("prompt_tokens", 0)
    out["tpot"] = (last - first) / (n - 1) if first and last and n > 1 else None
    out["gap"] = gap


def join_when_started(url: str, outs: list, words: int, max_tokens: int, out: dict) -> None:
    """Sends one long prompt once every client in `outs` streams text."""
    while not all("first" in o or "error" in o or "end" in o for o in outs):
        time.sleep(0.01)
    one_request(url, prompt_for(999, words), max_tokens, out)


def load_average() -> str:
    """The 1-minute load average (Linux), as a note on how quiet the machine was."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def run_level(
    url: str,
    n: int,
    max_tokens: int,
    words: int,
    rounds: int,
    join_words: int = 0,
    offset: int = 0,
    temperature: float = 0.0,
) -> dict:
    results = []
    joins = []
    t_start = time.perf_counter()
    for rnd in range(rounds):
        outs = [dict() for _ in range(n)]
        threads = [
            threading.Thread(
                target=one_request,
                args=(
                    url,
                    prompt_for(offset + i + 100 * rnd, words),
                    max_tokens,
                    outs[i],
                    temperature,
                ),
            )
            for i in range(n)
        ]
        if join_words > 0:
            joins.append(dict())
            threads.append(
                threading.Thread(
                    target=join_when_started, args=(url, outs, join_words, 8, joins[-1])
                )
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.extend(outs)
    wall = time.perf_counter() - t_start
    errors = [o["error"] for o in results if "error" in o]
    ok = [o for o in results if "error" not in o]
    tokens = sum(o["tokens"] for o in ok)
    prompt_tokens = sum(o["prompt_tokens"] for o in ok)
    ttft = [o["ttft"] for o in ok]
    tpot = [o["tpot"] for o in ok if o["tpot"] is not None]
    gaps = [o["gap"] for o in ok]
    joined = [o for o in joins if "error" not in o]
    errors += [o["error"] for o in joins if "error" in o]
    return {
        "clients": n,
        "requests": len(results),
        "errors": errors,
        "tokens": tokens,
        "wall_s": wall,
        "prompt_tokens_mean": prompt_tokens / len(ok) if ok else 0.0,
        "agg_tps": tokens / wall if wall > 0 else 0.0,
        "total_tps": (tokens + prompt_tokens) / wall if wall > 0 else 0.0,
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_max_s": max(ttft) if ttft else None,
        "tpot_mean_s": sum(tpot) / len(tpot) if tpot else None,
        "gap_max_s": max(gaps) if gaps else None,
        "join_prompt_tokens": joined[0]["prompt_tokens"] if joined else None,
        "join_ttft_s": sum(o["ttft"] for o in joined) / len(joined) if joined else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--join-words",
        type=int,
        default=0,
        help="once every client streams, one more sends a prompt this many words long "
        "(8 tokens): its TTFT and the longest gap between two texts of the others show "
        "how a long prompt admitted under load shares the steps",
    )
    ap.add_argument(
        "--prompt-offset",
        type=int,
        default=0,
        help="number the prompts from this (a warm-up load with other prompts than the "
        "timed one, so that no prefix cache serves the timed load)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature (the servers' other defaults: top-k 40, top-p, "
        "min-p) instead of greedily; seed 1",
    )
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--out", help="also append one JSON object per line to this file")
    ap.add_argument("--tag", default="", help="a note stored with each JSON line")
    a = ap.parse_args()
    if not a.json:
        print(
            f"| {'server':<12} | clients | prompt tok | gen tok/s | total tok/s "
            "| TTFT mean (s) | TTFT max (s) | TPOT (ms) | max gap (ms) | joined TTFT (s) | load avg |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    failed = False
    for n in a.clients:
        r = run_level(
            a.url,
            n,
            a.max_tokens,
            a.prompt_words,
            a.rounds,
            a.join_words,
            a.prompt_offset,
            a.temperature,
        )
        r["label"] = a.label
        r["tag"] = a.tag
        r["max_tokens"] = a.max_tokens
        r["rounds"] = a.rounds
        r["temperature"] = a.temperature
        r["loadavg"] = load_average()
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
        if r["errors"]:
            failed = True
            print(f"error: {len(r['errors'])} requests failed: {r['errors'][0]}", file=sys.stderr)
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            tpot = r["tpot_mean_s"]
            print(
                f"| {a.label:<12} | {n} | {r['prompt_tokens_mean']:.0f} | {r['agg_tps']:.1f} | "
                f"{r['total_tps']:.1f} | {r['ttft_mean_s'] or 0:.3f} | "
                f"{r['ttft_max_s'] or 0:.3f} | {tpot * 1e3 if tpot else 0:.1f} | "
                f"{(r['gap_max_s'] or 0) * 1e3:.0f} | "
                f"{'-' if r['join_ttft_s'] is None else format(r['join_ttft_s'], '.3f')} | "
                f"{r['loadavg']} |",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
