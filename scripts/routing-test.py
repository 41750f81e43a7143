#!/usr/bin/env python3
"""Does a router keep each conversation on the replica that caches it?

Runs the same workload — 8 multi-turn chats, each with its own long system
prompt, 6 turns each, all 8 running at once (so their turns interleave) —
against:
  1. one coil replica (all cores), directly;
  2. two replicas (cores split) behind SMG with --policy cache_aware;
  3. the same with --policy consistent_hashing and an X-SMG-Routing-Key
     header per conversation;
  4. the same with --policy round_robin;
and reports the cached-prompt share (prompt tokens taken from the prefix
cache over all prompt tokens, summed over the replicas' /metrics) and the
throughput of each. Every replica is started fresh for each run.

Loopback only; stdlib only. Needs target/release/coil and smg
(SMG=/path/to/smg, or on PATH).

    python3 scripts/routing-test.py [--threads 2] [--turns 6] [--convs 8]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
    "king queen lord lady duke crown sword honour grace heaven night day love "
    "death blood heart soul fair sweet noble gentle brave true false proud "
    "speak hear tell swear pray weep fight fly stay come go know think make "
    "Rome Verona Milan France England York Lancaster court field tower gate "
    "father mother brother sister son daughter friend foe master servant"
).split()


def http(url, body=None, headers=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def wait_up(url, secs=90):
    t0 = time.time()
    while time.time() - t0 < secs:
        try:
            http(url, timeout=2)
            return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"no answer from {url} after {secs} s")


def metrics(base):
    out = {}
    for line in http(base + "/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Cluster:
    """`n` coil replicas of `threads` threads each, and SMG if `policy`."""

    def __init__(self, args, n, threads, policy, logdir):
        self.procs, self.replicas = [], []
        self.logs = []
        try:
            self.start(args, n, threads, policy, logdir)
        except BaseException:
            self.stop()
            raise

    def start(self, args, n, threads, policy, logdir):
        for i in range(n):
            port = args.base_port + i
            log = open(os.path.join(logdir, f"coil-{policy or 'direct'}-{i}.log"), "w")
            self.logs.append(log)
            p = subprocess.Popen(
                [args.coil, "serve", "-m", args.model, "-t", str(threads),
                 "--host", "127.0.0.1", "--port", str(port), "--alias", "coil-demo",
                 "--parallel", "4", "--cache-slots", "8", "-q"],
                stdout=log, stderr=log)
            self.procs.append(p)
            self.replicas.append(f"http://127.0.0.1:{port}")
        for r in self.replicas:
            wait_up(r + "/health")
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"a replica exited at start (port in use?): see {logdir}")
        self.entry = self.replicas[0]
        if policy:
            log = open(os.path.join(logdir, f"smg-{policy}.log"), "w")
            self.logs.append(log)
            p = subprocess.Popen(
                [args.smg, "launch", "--host", "127.0.0.1", "--port", str(args.router_port),
                 "--worker-urls", *self.replicas, "--policy", policy,
                 "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", str(args.router_port + 1), "--log-level", "warn",
                 "--shutdown-grace-period-secs", "5"],
                stdout=log, stderr=log)
            self.procs.append(p)
            self.entry = f"http://127.0.0.1:{args.router_port}"
            wait_up(self.entry + "/health")
            t0 = time.time()
            while True:
                try:
                    if b"coil-demo" in http(self.entry + "/v1/models"):
                        break
                except OSError:  # 503 until a worker is registered
                    pass
                if time.time() - t0 > 60:
                    raise RuntimeError("SMG did not register the workers")
                time.sleep(0.2)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()


def system_prompt(i, n_words):
    rng = random.Random(1000 + i)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return f"You are player {i} of the company. " + " ".join(words) + "."


def conversation(entry, i, turns, n_words, max_tokens, key_header, results):
    messages = [{"role": "system", "content": system_prompt(i, n_words)}]
    rng = random.Random(i)
    stats = results[i] = {"prompt": 0, "cached": 0, "completion": 0, "errors": 0}
    for t in range(turns):
        messages.append({"role": "user",
                         "content": f"Turn {t}: speak of the {rng.choice(WORDS)} and the {rng.choice(WORDS)}."})
        headers = {"X-SMG-Routing-Key": f"conversation-{i}"} if key_header else {}
        body = {"model": "coil-demo", "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        try:
            v = json.loads(http(entry + "/v1/chat/completions", body, headers))
        except Exception as e:  # counted, not fatal: the table shows it
            print(f"conversation {i} turn {t}: {e}", file=sys.stderr)
            stats["errors"] += 1
            return
        u = v["usage"]
        stats["prompt"] += u["prompt_tokens"]
        stats["cached"] += u["prompt_tokens_details"]["cached_tokens"]
        stats["completion"] += u["completion_tokens"]
        messages.append({"role": "assistant", "content": v["choices"][0]["message"]["content"]})


def run(args, label, n, threads, policy, key_header, logdir):
    c = Cluster(args, n, threads, policy, logdir)
    try:
        results = {}
        t0 = time.time()
        ts = [threading.Thread(target=conversation,
                               args=(c.entry, i, args.turns, args.words, args.max_tokens, key_header, results))
              for i in range(args.convs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.time() - t0
        per = [metrics(r) for r in c.replicas]
    finally:
        c.stop()
    prompt = sum(m["coil_prompt_tokens_total"] for m in per)
    cached = sum(m["coil_prompt_tokens_cached_total"] for m in per)
    row = {
        "setup": label,
        "cached_share": cached / prompt if prompt else 0.0,
        "prompt_tokens": int(prompt),
        "cached_tokens": int(cached),
        "processed_tokens": int(sum(m["coil_prompt_tokens_processed_total"] for m in per)),
        "completion_tokens": int(sum(m["coil_completion_tokens_total"] for m in per)),
        "requests_per_replica": [int(m["coil_requests_total"]) for m in per],
        "errors": sum(r["errors"] for r in results.values()),
        "wall_s": wall,
    }
    row["completion_tok_per_s"] = row["completion_tokens"] / wall
    row["requests_per_s"] = sum(row["requests_per_replica"]) / wall
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coil", default=os.environ.get("COIL", os.path.join(HERE, "target/release/coil")))
    ap.add_argument("--smg", default=os.environ.get("SMG", shutil.which("smg") or "smg"))
    ap.add_argument("--model", default=os.path.join(HERE, "models/shakespeare-hybrid-q8_0.gguf"))
    ap.add_argument("--threads", type=int, default=2, help="cores, split between the replicas")
    ap.add_argument("--convs", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--words", type=int, default=300, help="words per system prompt")
    ap.add_argument("--max-tokens", type=int, default=24, help="tokens per reply")
    ap.add_argument("--base-port", type=int, default=18200)
    ap.add_argument("--router-port", type=int, default=18300)
    ap.add_argument("--only", help="comma-separated subset of single,single_half,cache_aware,consistent_hashing,round_robin (default all but single_half)")
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="coil-routing-")
    print(f"logs in {logdir}", file=sys.stderr)
    half = max(1, args.threads // 2)
    plans = [
        ("single", "1 replica, direct", 1, args.threads, None, False),
        ("single_half", f"1 replica with {half} thread(s), direct", 1, half, None, False),
        ("cache_aware", "2 replicas, SMG cache_aware", 2, half, "cache_aware", False),
        ("consistent_hashing", "2 replicas, SMG consistent_hashing + X-SMG-Routing-Key", 2, half,
         "consistent_hashing", True),
        ("round_robin", "2 replicas, SMG round_robin", 2, half, "round_robin", False),
    ]
    # single_half (one replica on half the cores) only when asked for.
    only = set(args.only.split(",")) if args.only else {n for n, *_ in plans} - {"single_half"}
    rows = [run(args, label, n, t, pol, key, logdir)
            for name, label, n, t, pol, key in plans if name in only]
    print("\n| setup | cached-prompt share | prompt tokens (cached) | requests per replica | errors | wall s | completion tok/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {100 * r['cached_share']:.1f}% | {r['prompt_tokens']} ({r['cached_tokens']}) "
              f"| {r['requests_per_replica']} | {r['errors']} | {r['wall_s']:.1f} | {r['completion_tok_per_s']:.1f} |")


if __name__ == "__main__":
    main()
