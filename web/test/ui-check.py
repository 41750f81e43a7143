#!/usr/bin/env python3
"""The chat page in a real browser: starts `coil serve` on the bundled demo
model (with an API key) and drives headless Chromium through what a person
does — enter the key, send, watch the reply stream, stop it, edit the first
message and see the conversation resume from the cache, regenerate, switch
conversations, reload and find the history, attach a file, export and
import, ask for a JSON schema or a GBNF grammar per conversation — and what
must not happen: HTML in a reply that runs, a server error
or a dropped stream that loses what was typed. Writes screenshots (light,
dark, narrow, resumed, structured output) to --out.

Needs Chromium (Debian: `apt-get install chromium`) and Playwright for
Python (`pip install playwright`; its own browser download is not used),
and a built `coil` (`cargo build --release -p coil-cli`):

    python3 web/test/ui-check.py [--coil target/release/coil] [--out DIR]

Prints one line per check and `N passed, M failed`; exits 1 on a failure.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
KEY = "ui-check-key"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SYSTEM = (
    "You are a player in a company of actors. Answer every question in the "
    "manner of the plays, in verse where you can, and never break character."
)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok    {name}")
        else:
            self.failed += 1
            print(f"FAIL  {name}{': ' + str(detail) if detail else ''}")
        return ok


def start_server(coil, extra):
    cmd = [str(coil), "serve", "-m", str(ROOT / "models/shakespeare-hybrid-q8_0.gguf")]
    cmd += ["--port", "0", "--parallel", "2", "--cache-slots", "4", "--ctx", "4096", "-t", "1"]
    cmd += extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    url = None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.match(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1) + "/"
            break
    if url is None:
        proc.kill()
        sys.exit("coil serve did not start:\n" + "".join(log))
    # Keep reading its log so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()
    return proc, url, log


def sse(chunks, done=True):
    """A streamed chat reply: `chunks` are deltas (dicts) or raw dicts with 'raw'."""
    out = []
    base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    for c in chunks:
        if "raw" in c:
            body = c["raw"]
        else:
            finish = c.pop("finish_reason", None)
            body = {**base, "choices": [{"index": 0, "delta": c, "finish_reason": finish}]}
        out.append(f"data: {json.dumps(body)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coil", default=None, help="the coil binary (default: target/release/coil, else target/debug/coil)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", default=str(ROOT / "target/ui-check"), help="where the screenshots go")
    args = ap.parse_args()
    coil = Path(args.coil) if args.coil else next(
        (p for p in (ROOT / "target/release/coil", ROOT / "target/debug/coil") if p.exists()), None
    )
    if coil is None or not coil.exists():
        sys.exit("no coil binary: cargo build --release -p coil-cli (or pass --coil)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    c = Checks()
    proc, url, log = start_server(coil, ["--api-key", KEY])
    profile = tempfile.mkdtemp(prefix="coil-ui-check-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile,
                executable_path=args.chromium,
                headless=True,
                args=FLAGS,
                viewport={"width": 1280, "height": 820},
                accept_downloads=True,
            )
            run(ctx, url, c, out)
            ctx.close()
    except PlaywrightError as e:
        c.check("every step ran (none timed out or failed in the browser)", False, e)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
    print(f"{c.passed} passed, {c.failed} failed")
    if c.failed:
        print("server log (last lines):\n" + "".join(log[-20:]))
    sys.exit(1 if c.failed else 0)


def last_reply(page):
    return page.locator("article.msg.assistant").last


def wait_idle(page, timeout=120000):
    """Until no reply streams (the Send button is back)."""
    page.wait_for_selector("#send:not([hidden])", timeout=timeout)


def settings(page, **values):
    if page.locator("#settings").is_hidden():
        page.click("#settings-button")
    for k, v in values.items():
        if k == "format":
            page.select_option("#s-format", str(v))
        else:
            page.fill(f"#s-{k}", str(v))
    page.click("#settings-close")


def send(page, text):
    page.fill("#input", text)
    page.press("#input", "Enter")


def cache_figures(page):
    el = last_reply(page).locator(".stats .cache")
    el.wait_for(timeout=120000)
    return (
        int(el.get_attribute("data-prompt")),
        int(el.get_attribute("data-cached")),
        el.get_attribute("data-kind"),
        el.inner_text(),
    )


def run(ctx, url, c, out):
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("dialog", lambda d: d.accept())
    page.goto(url)

    # ---- the API key: the page asks, a wrong key is refused, the right one works
    page.wait_for_selector("#key-dialog[open]", timeout=10000)
    c.check("without a key the page asks for one", "--api-key" in page.inner_text("#key-dialog") or "key" in page.inner_text("#key-why"))
    page.fill("#key-input", "wrong-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.getElementById('key-why').textContent.includes('Incorrect')", timeout=10000)
    c.check("a wrong key is refused with the server's message", "Incorrect API key" in page.inner_text("#key-why"))
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.getElementById('model').textContent.includes('shakespeare')", timeout=10000)
    c.check("with the key the model is listed", "shakespeare-hybrid" in page.inner_text("#model"), page.inner_text("#model"))

    # ---- a streamed reply, with a system prompt whose end the server checkpoints.
    # The download is throttled (DevTools' network emulation) so that a fast
    # build's reply still arrives over many frames.
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    throttle = lambda bps: cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": bps, "uploadThroughput": -1},
    )
    throttle(8000)
    settings(page, system=SYSTEM, temperature=0.8, seed=7, max_tokens=64)
    page.evaluate(
        """() => {
        window.__partials = new Set();
        new MutationObserver(() => {
          const el = document.querySelector('.msg.streaming .content');
          if (el && el.textContent) window.__partials.add(el.textContent.length);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }"""
    )
    send(page, "ROMEO: What light through yonder window breaks?")
    wait_idle(page)
    partials = page.evaluate("window.__partials.size")
    reply = last_reply(page).locator(".content").inner_text()
    c.check("the reply streamed in (seen at several lengths)", partials >= 3, f"{partials} lengths")
    c.check("the reply has text", len(reply.strip()) > 20, reply[:80])
    c.check(
        "messages hold only their parts (no stray text)",
        page.evaluate("() => [...document.querySelectorAll('article.msg')].every(m => [...m.childNodes].every(n => n.nodeType === 1))"),
    )
    prompt, cached, kind, text = cache_figures(page)
    speed = last_reply(page).locator(".stats .speed").inner_text()
    c.check("the reply shows prompt tokens and cache use", prompt > 20 and kind == "new", text)
    c.check("the reply shows time to first token and tokens/s", "first token" in speed and "tokens/s" in speed, speed)
    page.screenshot(path=str(out / "chat-light.png"))

    # ---- a second turn reuses the first from the cache
    send(page, "JULIET: Wherefore art thou?")
    wait_idle(page)
    prompt2, cached2, _, text2 = cache_figures(page)
    c.check("the second turn reuses the first from the cache", cached2 >= prompt and cached2 < prompt2, text2)

    # ---- stop mid-stream
    settings(page, max_tokens=400)
    send(page, "Tell the whole tale again, at length.")
    page.wait_for_function(
        "() => { const el = document.querySelector('.msg.streaming .content'); return el && el.textContent.length > 30; }",
        timeout=120000,
    )
    page.click("#stop")
    wait_idle(page)
    stopped = last_reply(page)
    c.check("Stop ends the reply and says so", stopped.locator(".note").inner_text() == "stopped")
    c.check("what arrived before Stop is kept", len(stopped.locator(".content").inner_text()) > 30)
    throttle(-1)
    settings(page, max_tokens=64)

    # ---- edit the first message: the conversation resumes after the system prompt
    first = page.locator("article.msg.user").first
    first.hover()
    first.locator("[data-act=edit]").click()
    page.fill("article.msg.user textarea.edit", "ROMEO: But soft, what light?")
    page.click("[data-act=save-edit]")
    wait_idle(page)
    n_msgs = page.locator("article.msg").count()
    prompt3, cached3, kind3, text3 = cache_figures(page)
    c.check("editing the first message drops what followed it", n_msgs == 2, n_msgs)
    c.check(
        "the edited conversation resumed from the cache (system prompt not re-processed)",
        kind3 == "edit" and 0 < cached3 < prompt3 and "resumed at token" in text3,
        text3,
    )

    # ---- regenerate: everything but the reply comes from the cache
    last_reply(page).hover()
    last_reply(page).locator("[data-act=regenerate]").click()
    wait_idle(page)
    prompt4, cached4, kind4, text4 = cache_figures(page)
    c.check(
        "a regenerated reply resumes at (nearly) the whole prompt",
        kind4 == "regenerate" and prompt4 == prompt3 and cached4 >= prompt4 - 2 and f"resumed at token {cached4:,} of {prompt4:,}" in text4,
        text4,
    )
    page.screenshot(path=str(out / "chat-resumed.png"))

    # ---- attach a text file as context
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("Now is the winter of our discontent\nMade glorious summer by this sun of York.\n")
        attached = f.name
    page.set_input_files("#attach-file", attached)
    page.wait_for_selector("#pending details.chip")
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Who speaks these lines?")
    body = json.loads(req.value.post_data)
    os.unlink(attached)
    wait_idle(page)
    sent = body["messages"][-1]["content"]
    c.check("an attached file goes to the model with the message", "winter of our discontent" in sent and sent.endswith("Who speaks these lines?"), sent[:120])
    c.check("the attachment is shown on the message", page.locator("article.msg.user").last.locator("details.chip").count() == 1)
    c.check("sampling settings go with the request", body.get("temperature") == 0.8 and body.get("seed") == 7 and body.get("max_tokens") == 64, body)
    c.check("the system prompt goes first", body["messages"][0] == {"role": "system", "content": SYSTEM})

    # ---- a second conversation, then back
    first_title = page.inner_text("#title")
    page.click("#new-chat")
    send(page, "HAMLET: To be, or not to be?")
    wait_idle(page)
    c.check("a new conversation starts empty and gets its own reply", page.locator("article.msg").count() == 2)
    items = page.locator("#conversations li")
    c.check("both conversations are listed", items.count() == 2, items.count())
    page.locator("#conversations li", has_text=first_title).click()
    c.check("switching back shows the first conversation", page.locator("article.msg").count() == 4 and page.inner_text("#title") == first_title)

    # ---- rename
    li = page.locator("#conversations li", has_text=first_title)
    li.hover()
    li.locator("[data-act=rename]").click()
    page.fill("#conversations input.rename", "Balcony scene")
    page.press("#conversations input.rename", "Enter")
    c.check("a conversation can be renamed", page.inner_text("#title") == "Balcony scene")

    # ---- what is typed survives a reload, and so does the history
    page.fill("#input", "half-typed thought")
    page.wait_for_timeout(400)
    page.reload()
    page.wait_for_selector("article.msg")
    c.check("after a reload the conversation is there", page.locator("article.msg").count() == 4 and page.inner_text("#title") == "Balcony scene")
    c.check("after a reload both conversations are listed", page.locator("#conversations li").count() == 2)
    c.check("after a reload the typed text is still in the box", page.input_value("#input") == "half-typed thought")
    c.check("after a reload the cache figures are still shown", "resumed at token" in page.locator("article.msg.assistant").nth(0).inner_text() or page.locator(".stats .cache").count() == 2)

    # ---- HTML in a reply is text: nothing in it runs (a reply the server is made to send)
    evil = (
        "Hello <script>window.__pwned = 'script'</script> and "
        '<img src=x onerror="window.__pwned = \'img\'"> and '
        "[a link](javascript:window.__pwned='link') and ![img](x.png) "
        "and $\\href{javascript:window.__pwned='math'}{x}$ done."
    )
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200,
            headers={"content-type": "text/event-stream"},
            body=sse(
                [
                    {"role": "assistant", "reasoning_content": '<img src=y onerror="window.__pwned=\'reasoning\'">think'},
                    {"content": evil},
                    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "<img src=z onerror=\"window.__pwned='tool'\">", "arguments": '{"q": "<script>window.__pwned=1</script>"}'}}]},
                    {"finish_reason": "stop"},
                ]
            ),
        ),
    )
    send(page, "say something dangerous")
    wait_idle(page)
    page.wait_for_timeout(300)
    r = last_reply(page)
    c.check("a <script> in a reply does not run", page.evaluate("window.__pwned") is None, page.evaluate("window.__pwned"))
    c.check("no element of the reply is a script or an image", r.locator("script, img, iframe").count() == 0)
    c.check("HTML in a reply is shown as text", "<script>window.__pwned = 'script'</script>" in r.locator(".content").inner_text())
    c.check("javascript: links are not links", r.locator("a[href^='javascript']").count() == 0)
    c.check("reasoning is a collapsible block", r.locator("details.reasoning summary").count() == 1 and "<img" in r.locator("details.reasoning").text_content())
    c.check("tool calls are shown as such", r.locator(".tool-call .badge").inner_text().lower() == "tool call" and "<img" in r.locator(".tool-call code").first.inner_text())
    page.unroute("**/v1/chat/completions")

    # ---- a tool call answered from the page; the result goes back with the call
    seen = []

    def answer(route):
        seen.append(json.loads(route.request.post_data))
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=sse([{"content": "Thank you, tool."}, {"finish_reason": "stop"}]))

    page.route("**/v1/chat/completions", answer)
    r.locator("[data-act=tool-result]").click()
    page.fill(".tool-input", '{"temperature": 21}')
    page.click("[data-act=send-tool]")
    wait_idle(page)
    msgs = seen[-1]["messages"] if seen else []
    c.check(
        "a tool result goes back after the call it answers",
        len(msgs) >= 2
        and msgs[-2]["role"] == "assistant"
        and msgs[-2]["tool_calls"][0]["id"] == "call_1"
        and msgs[-1] == {"role": "tool", "content": '{"temperature": 21}', "tool_call_id": "call_1", "name": "<img src=z onerror=\"window.__pwned='tool'\">"},
        msgs[-2:],
    )
    c.check("the reply to a tool result is shown", last_reply(page).locator(".content").inner_text() == "Thank you, tool.")

    # ---- an assistant message edited is what the model sees next
    last_reply(page).hover()
    last_reply(page).locator("[data-act=edit]").click()
    page.fill("article.msg.assistant textarea.edit", "Thank you, edited.")
    page.click("[data-act=save-edit]")
    send(page, "and then?")
    wait_idle(page)
    msgs = seen[-1]["messages"]
    c.check("an edited reply is sent as edited", msgs[-2] == {"role": "assistant", "content": "Thank you, edited."}, msgs[-2:])
    page.unroute("**/v1/chat/completions")

    # ---- Markdown, highlighted code with a copy button, math (rendered in the page)
    md = "# Title\n\nSome **bold** and `code`.\n\n```python\ndef f(x):\n    return x ** 2  # square\n```\n\nInline $e^{i\\pi} + 1 = 0$ and display:\n\n$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$\n\nCosts $5 and $10.\n"
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=sse([{"content": md[:40]}, {"content": md[40:]}, {"finish_reason": "stop"}])),
    )
    send(page, "show me formatting")
    wait_idle(page)
    r = last_reply(page)
    c.check("Markdown is rendered", r.locator("h1").inner_text() == "Title" and r.locator("strong").inner_text() == "bold")
    c.check("code is highlighted", r.locator(".code .hljs-keyword").count() >= 1 and r.locator(".code-bar span").inner_text() == "python")
    c.check("math is rendered (MathML)", r.locator("math").count() == 2 and r.locator(".math-block math").count() == 1)
    c.check("dollar amounts stay text", "Costs $5 and $10." in r.inner_text())
    ctx.grant_permissions(["clipboard-read", "clipboard-write"])
    r.locator(".copy-code").click()
    clip = page.evaluate("navigator.clipboard.readText()")
    c.check("the copy button copies the code", clip.startswith("def f(x):"), clip)
    page.unroute("**/v1/chat/completions")

    # ---- a server error and a dropped stream: readable, and nothing typed is lost
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=503, headers={"content-type": "application/json"}, body=json.dumps({"error": {"message": "the server is busy: 4 requests are already waiting (--max-queue); retry later", "type": "server_error", "param": None, "code": "queue_full"}})),
    )
    typed = "A long question I typed with care."
    send(page, typed)
    wait_idle(page)
    err = last_reply(page).locator(".error").inner_text()
    c.check("a server error is shown readably", "503" in err and "busy" in err, err)
    c.check("the message that failed is kept", page.locator("article.msg.user").last.locator(".text").inner_text() == typed)
    page.unroute("**/v1/chat/completions")
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=sse([{"content": "The first half of a reply"}], done=False)),
    )
    last_reply(page).hover()
    last_reply(page).locator("[data-act=regenerate]").click()
    wait_idle(page)
    r = last_reply(page)
    c.check("a dropped stream says so", "dropped" in r.locator(".error").inner_text(), r.locator(".error").inner_text())
    c.check("what arrived before the drop is kept", "The first half of a reply" in r.locator(".content").inner_text())
    page.unroute("**/v1/chat/completions")

    # ---- export, delete, import
    with page.expect_download() as dl:
        page.click("#export-all")
    exported = Path(dl.value.path()).read_text()
    data = json.loads(exported)
    c.check("export writes every conversation as JSON", data.get("format") == "coil-chat" and len(data["conversations"]) == 2)
    li = page.locator("#conversations li.current")
    li.hover()
    li.locator("[data-act=delete]").click()
    c.check("a conversation can be deleted", page.locator("#conversations li").count() == 1)
    path = Path(tempfile.mkdtemp()) / "export.json"
    path.write_text(exported)
    page.set_input_files("#import-file", str(path))
    page.wait_for_function("() => document.querySelectorAll('#conversations li').length === 3", timeout=5000)
    c.check("import brings conversations back (under new ids where taken)", page.locator("#conversations li").count() == 3)
    c.check("an imported conversation keeps its messages and figures", page.locator("#conversations li", has_text="Balcony scene").count() == 1)
    shutil.rmtree(path.parent, ignore_errors=True)

    # ---- themes and a phone-sized screen
    page.locator("#conversations li", has_text="Balcony scene").click()
    page.evaluate("localStorage.setItem('coil.theme', JSON.stringify('dark'))")
    page.reload()
    page.wait_for_selector("article.msg")
    c.check("the dark theme applies", page.evaluate("document.documentElement.dataset.theme") == "dark")
    page.screenshot(path=str(out / "chat-dark.png"))
    page.click("#theme")
    c.check("the theme button cycles to the system's theme", page.inner_text("#theme") == "Theme: system")
    page.click("#theme")
    c.check("then to light", page.evaluate("document.documentElement.dataset.theme") == "light")
    page.set_viewport_size({"width": 390, "height": 780})
    page.wait_for_timeout(200)
    no_overflow = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    c.check("a phone-sized screen has no sideways scrolling", no_overflow)
    box = page.locator("#sidebar").bounding_box()
    c.check("on a phone the list is behind the menu button", page.locator("#menu").is_visible() and box["x"] + box["width"] <= 0, box)
    page.screenshot(path=str(out / "chat-narrow.png"))
    page.click("#menu")
    page.wait_for_timeout(300)
    c.check("the menu button opens the list", page.locator("#sidebar").bounding_box()["x"] >= 0)
    page.screenshot(path=str(out / "chat-narrow-list.png"))
    page.click("#scrim", position={"x": 370, "y": 400})
    page.set_viewport_size({"width": 1280, "height": 820})

    # ---- structured output per conversation: a JSON schema, a bad schema's
    # 400, a GBNF grammar (the real server constrains the reply)
    page.click("#new-chat")
    person = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    page.click("#settings-button")
    c.check("the schema box is hidden for free text", page.locator("#s-format_spec").is_hidden())
    page.select_option("#s-format", "json_schema")
    c.check("choosing JSON schema shows the schema box", page.locator("#s-format_spec").is_visible() and page.inner_text("#s-format_spec-name") == "JSON schema")
    page.fill("#s-format_spec", "{not json")
    c.check("a schema that is not JSON is named in the settings", page.locator("#s-error").is_visible() and "not JSON" in page.inner_text("#s-error"), page.inner_text("#s-error"))
    settings(page, format_spec=json.dumps(person), temperature=0, max_tokens=120)
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Who art thou? Answer as JSON.")
    body = json.loads(req.value.post_data)
    wait_idle(page)
    rf = body.get("response_format") or {}
    c.check("the JSON schema goes with the request", rf.get("type") == "json_schema" and rf.get("json_schema", {}).get("schema") == person, rf)
    # (the stored text: Markdown rendering may change what is shown)
    stored = "() => JSON.parse(localStorage.getItem('coil.conv.' + JSON.parse(localStorage.getItem('coil.current')))).messages.at(-1).content"
    text = page.evaluate(stored)
    try:
        v = json.loads(text)
        ok = isinstance(v, dict) and set(v) == {"name", "age"} and isinstance(v["age"], int) and len(v["name"]) <= 12
    except ValueError:
        ok = False
    c.check("the reply follows the JSON schema", ok, text)
    bad = {"type": "object", "properties": {"age": {"type": "integr"}}}
    settings(page, format_spec=json.dumps(bad))
    send(page, "And thy age?")
    wait_idle(page)
    err = last_reply(page).locator(".error").inner_text()
    c.check("an invalid schema's 400 is shown readably, naming the path", "400" in err and "response_format.json_schema.schema.properties.age.type" in err, err)
    page.click("#settings-button")
    page.screenshot(path=str(out / "chat-structured.png"))
    page.click("#settings-close")
    settings(page, format="grammar")
    c.check("choosing a grammar relabels the box", page.inner_text("#s-format_spec-name") == "GBNF grammar")
    settings(page, format_spec='root ::= ("yea" | "nay") "."')
    with page.expect_request("**/v1/chat/completions") as req:
        send(page, "Wilt thou come?")
    body = json.loads(req.value.post_data)
    wait_idle(page)
    text = page.evaluate(stored)
    c.check("the grammar goes with the request (and no response_format)", body.get("grammar", "").startswith("root ::=") and "response_format" not in body, body)
    c.check("the reply follows the grammar", text in ("yea.", "nay."), text)
    structured_title = page.inner_text("#title")
    page.locator("#conversations li", has_text="Balcony scene").click()
    page.click("#settings-button")
    c.check("another conversation keeps its own format (free text)", page.input_value("#s-format") == "" and page.locator("#s-format_spec").is_hidden())
    page.click("#settings-close")
    page.reload()
    page.wait_for_selector("article.msg")
    page.locator("#conversations li", has_text=structured_title).click()
    page.click("#settings-button")
    c.check("the format is kept across a reload", page.input_value("#s-format") == "grammar" and page.input_value("#s-format_spec").startswith("root ::="))
    page.select_option("#s-format", "")
    page.click("#settings-close")

    # The browser logs the refused requests (401, 503) it was made to send.
    errors = [e for e in errors if not e.startswith("Failed to load resource")]
    c.check("no script errors in the page", not errors, errors)


if __name__ == "__main__":
    main()
