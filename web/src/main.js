// The chat page: conversations kept in the browser, replies streamed from
// the server, and under each reply what the server's prefix cache saved.

import { ApiError, getModel, setApiKey, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import * as store from "./store.js";
import { $, h, messageEl, pendingEl, renderList, updateStreaming, withAttachments, num } from "./view.js";

const MAX_ATTACHMENT = 2 << 20; // characters

const state = {
  conv: null, // the conversation shown
  model: null, // { id, n_ctx }
  stream: null, // { conv, msg, ctrl, el } while a reply streams
  editing: null, // { index, text }
  renaming: null, // id of the conversation being renamed
  toolReply: null, // { index, call } while a tool result is typed
};

// ---------------------------------------------------------------- notices

function notice(text, kind = "error") {
  const n = $("notice");
  n.textContent = text;
  n.className = `notice ${kind}`;
  n.hidden = !text;
}

function save(conv, touch = true) {
  try {
    store.saveConversation(conv, touch);
  } catch (e) {
    notice(e.message);
  }
}

// ---------------------------------------------------------------- theme

const THEMES = ["system", "light", "dark"];
const media = window.matchMedia("(prefers-color-scheme: dark)");

function applyTheme() {
  const pref = store.loadPref("theme", "system");
  const dark = pref === "dark" || (pref === "system" && media.matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  $("theme").textContent = `Theme: ${pref}`;
}
media.addEventListener?.("change", applyTheme);

// ---------------------------------------------------------------- API key

let keyResolve = null;

function askKey(why) {
  $("key-why").textContent = why || "This server was started with --api-key.";
  $("key-input").value = store.loadPref("apiKey", "");
  const d = $("key-dialog");
  if (!d.open) d.showModal();
  $("key-input").focus();
  return new Promise((resolve) => {
    keyResolve = resolve;
  });
}

function closeKey(key) {
  const d = $("key-dialog");
  if (d.open) d.close();
  if (keyResolve) keyResolve(key);
  keyResolve = null;
}

async function loadModel() {
  for (;;) {
    try {
      state.model = await getModel();
      $("model").textContent = state.model.id + (state.model.n_ctx ? ` · ctx ${num(state.model.n_ctx)}` : "");
      $("model").title = "The model this server runs";
      renderMessages();
      return;
    } catch (e) {
      $("model").textContent = "not connected";
      $("model").title = e.message;
      if (e.status === 401) {
        const key = await askKey(e.message);
        if (key === null) return;
        continue;
      }
      notice(e.message);
      return;
    }
  }
}

// ---------------------------------------------------------------- conversations

function settingsDefaults() {
  return store.loadPref("defaults", {});
}

function openConversation(conv) {
  for (const m of conv.messages) {
    if (m.streaming && !(state.stream && state.stream.msg === m)) {
      delete m.streaming;
      m.error = "The page was closed or reloaded while this reply streamed; what had arrived is kept.";
      save(conv, false);
    }
  }
  state.conv = conv;
  state.editing = null;
  state.toolReply = null;
  store.savePref("current", conv.id);
  $("input").value = conv.draft || "";
  autosize();
  notice("");
  renderAll();
  $("messages").scrollTop = $("messages").scrollHeight;
  document.body.classList.remove("side-open");
  $("scrim").hidden = true;
}

function newConversation() {
  // An empty conversation is reused rather than piling up.
  const empty = store.listConversations().find((c) => c.messages.length === 0 && !c.draft && !c.pending.length);
  const conv = empty || store.createConversation(settingsDefaults());
  if (!empty) save(conv);
  openConversation(conv);
  $("input").focus();
}

function renderAll() {
  renderList($("conversations"), store.listConversations(), state.conv && state.conv.id, state.renaming);
  renderTitle();
  renderMessages();
  renderSettings();
  renderComposer();
}

function renderTitle() {
  $("title").textContent = state.conv ? state.conv.title : "";
  const stats = (state.conv ? state.conv.messages : []).map((m) => m.stats).filter((s) => s && Number.isFinite(s.prompt_tokens));
  const prompt = stats.reduce((a, s) => a + s.prompt_tokens, 0);
  const cached = stats.reduce((a, s) => a + (s.cached_tokens || 0), 0);
  $("summary").textContent = prompt ? `cache: ${Math.round((100 * cached) / prompt)}% of ${num(prompt)} prompt tokens reused` : "";
}

function answeredCalls(conv) {
  return new Set(conv.messages.filter((m) => m.role === "tool" && m.tool_call_id).map((m) => m.tool_call_id));
}

function msgCtx() {
  const conv = state.conv;
  const streamingHere = state.stream && state.stream.conv === conv;
  return {
    model: state.model && state.model.id,
    streamingIndex: streamingHere ? conv.messages.indexOf(state.stream.msg) : -1,
    editing: state.editing,
    answered: answeredCalls(conv),
    last: conv.messages.length - 1,
    busy: Boolean(state.stream),
  };
}

function renderMessages() {
  const box = $("messages");
  if (!state.conv) return;
  const ctx = msgCtx();
  const els = state.conv.messages.map((m, i) => messageEl(m, i, ctx));
  if (state.toolReply) {
    const { index, call } = state.toolReply;
    const host = els[index] && els[index].querySelector(`.tool-call[data-call="${call}"]`);
    if (host) {
      host.querySelector('[data-act="tool-result"]')?.remove();
      host.append(
        h("textarea.edit.tool-input", { rows: 3, placeholder: "The tool's result" }),
        h(
          "div.actions.editing",
          {},
          h("button.primary.small", { type: "button", "data-act": "send-tool" }, "Send result"),
          h("button.small", { type: "button", "data-act": "cancel-tool" }, "Cancel"),
        ),
      );
    }
  }
  if (!els.length) {
    els.push(
      h(
        "div.empty",
        {},
        h("p", {}, "Ask something. Replies stream here; under each one, how much of the prompt the server reused from its cache."),
        h("p.hint", {}, "Conversations stay in this browser. Settings (⚙): system prompt, sampling, tools."),
      ),
    );
  }
  box.replaceChildren(...els);
  if (state.stream && state.stream.conv === state.conv) {
    state.stream.el = box.querySelector(`.msg[data-index="${ctx.streamingIndex}"]`);
  }
}

function renderComposer() {
  const busy = Boolean(state.stream);
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("pending").replaceChildren(...[pendingEl(state.conv ? state.conv.pending : [])].filter(Boolean));
}

// ---------------------------------------------------------------- settings

const FIELDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "tools"];

function renderSettings() {
  if (!state.conv) return;
  for (const f of FIELDS) {
    const el = $(`s-${f}`);
    if (document.activeElement !== el) el.value = state.conv.settings[f] ?? "";
  }
  checkSettings();
}

/** The sampling fields of a request, or an Error naming the bad one. */
function requestSettings(s) {
  const out = {};
  const number = (name, int, lo, hi) => {
    const raw = String(s[name] ?? "").trim();
    if (raw === "") return;
    const v = Number(raw);
    if (!Number.isFinite(v) || (int && !Number.isInteger(v)) || v < lo || v > hi) {
      throw new Error(`${name} must be ${int ? "an integer" : "a number"} from ${lo} to ${hi}, not "${raw}"`);
    }
    out[name] = v;
  };
  number("temperature", false, 0, 100);
  number("top_p", false, 0, 1);
  number("top_k", true, 0, 1e9);
  number("min_p", false, 0, 1);
  number("max_tokens", true, 1, 1e9);
  number("seed", true, -(2 ** 53), 2 ** 53);
  const tools = String(s.tools || "").trim();
  if (tools) {
    let v;
    try {
      v = JSON.parse(tools);
    } catch (e) {
      throw new Error(`tools is not JSON: ${e.message}`);
    }
    if (!Array.isArray(v)) throw new Error("tools must be a JSON array of tools");
    if (v.length) out.tools = v;
  }
  return out;
}

function checkSettings() {
  const err = $("s-error");
  try {
    requestSettings(state.conv.settings);
    err.hidden = true;
    return true;
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
    return false;
  }
}

// ---------------------------------------------------------------- generation

function requestMessages(conv, upto) {
  const out = [];
  if (conv.settings.system.trim()) out.push({ role: "system", content: conv.settings.system });
  for (const m of conv.messages.slice(0, upto)) {
    if (m.role === "user") out.push({ role: "user", content: withAttachments(m) });
    else if (m.role === "tool") {
      const t = { role: "tool", content: m.content };
      if (m.tool_call_id) t.tool_call_id = m.tool_call_id;
      if (m.name) t.name = m.name;
      out.push(t);
    } else if (m.role === "assistant") {
      const hasCalls = m.tool_calls && m.tool_calls.length;
      if (!m.content && !hasCalls) continue; // a reply that never came
      const a = { role: "assistant", content: m.content };
      // Sent back as generated, so the prompt reads as the cached tokens do.
      if (m.reasoning) a.reasoning_content = m.reasoning;
      if (hasCalls) a.tool_calls = m.tool_calls;
      out.push(a);
    }
  }
  return out;
}

/** Streams a reply to the conversation as it stands; `kind` is new / regenerate / edit / tool. */
async function generate(conv, kind) {
  if (state.stream) return;
  let settings;
  try {
    settings = requestSettings(conv.settings);
  } catch (e) {
    notice(`Settings: ${e.message}`);
    return;
  }
  notice("");
  const msg = { role: "assistant", content: "", reasoning: "", stats: { kind }, streaming: true };
  const body = { model: state.model ? state.model.id : undefined, messages: requestMessages(conv, conv.messages.length), ...settings };
  conv.messages.push(msg);
  save(conv);
  const ctrl = new AbortController();
  state.stream = { conv, msg, ctrl, el: null };
  state.editing = null;
  renderAll();
  scrollDown(true);

  const t0 = performance.now();
  let tFirst = null;
  let pending = false;
  const calls = [];
  let lastSave = t0;
  const paint = () => {
    pending = false;
    // What arrived survives a reload or a closed tab.
    if (performance.now() - lastSave > 1000) {
      lastSave = performance.now();
      save(conv, false);
    }
    const s = state.stream;
    if (!s || s.conv !== state.conv || !s.el) return;
    const follow = nearBottom();
    s.el = updateStreaming(s.el, msg, msgCtx());
    if (follow) scrollDown();
  };
  const schedule = () => {
    if (!pending) {
      pending = true;
      requestAnimationFrame(paint);
    }
  };
  try {
    await streamChat(
      body,
      (ev) => {
        if (ev.type === "first") {
          tFirst = performance.now();
          msg.stats.ttft_ms = tFirst - t0;
        } else if (ev.type === "delta") {
          if (ev.content) msg.content += ev.content;
          if (ev.reasoning) msg.reasoning += ev.reasoning;
          for (const d of ev.tool_calls || []) {
            const k = Number.isInteger(d.index) ? d.index : calls.length;
            const c = (calls[k] ||= { id: "", type: "function", function: { name: "", arguments: "" } });
            if (d.id) c.id = d.id;
            if (d.function && d.function.name) c.function.name += d.function.name;
            if (d.function && d.function.arguments) c.function.arguments += d.function.arguments;
            msg.tool_calls = calls.filter(Boolean);
          }
          schedule();
        } else if (ev.type === "finish") {
          msg.stats.finish = ev.reason;
          msg.stats.gen_ms = performance.now() - (tFirst ?? t0);
        } else if (ev.type === "usage") {
          const u = ev.usage;
          msg.stats.prompt_tokens = u.prompt_tokens;
          msg.stats.completion_tokens = u.completion_tokens;
          msg.stats.cached_tokens = (u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens) || 0;
        }
      },
      ctrl.signal,
    );
  } catch (e) {
    if (e.name === "AbortError") {
      msg.stopped = true;
    } else {
      msg.error = e instanceof ApiError ? e.message : `Unexpected error: ${e.message || e}`;
      if (e.status === 401) {
        askKey(e.message).then((key) => {
          if (key !== null) notice("Key set: press “Regenerate” to send again.", "info");
        });
      }
    }
  } finally {
    delete msg.streaming;
    if (!msg.reasoning) delete msg.reasoning;
    if (msg.stats.gen_ms === undefined && tFirst !== null) msg.stats.gen_ms = performance.now() - tFirst;
    state.stream = null;
    save(conv);
    if (conv === state.conv) {
      const follow = nearBottom();
      renderAll();
      if (follow) scrollDown();
    }
  }
}

function nearBottom() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function send() {
  const conv = state.conv;
  if (!conv || state.stream) return;
  const text = $("input").value;
  if (!text.trim() && !conv.pending.length) return;
  if (!checkSettings()) {
    notice(`Settings: ${$("s-error").textContent}`);
    return;
  }
  conv.messages.push({ role: "user", content: text, ...(conv.pending.length ? { attachments: conv.pending } : {}) });
  if (conv.title === "New chat") {
    const first = (text.trim() || conv.pending[0].name).replace(/\s+/g, " ");
    conv.title = first.length > 60 ? first.slice(0, 57) + "…" : first;
  }
  conv.pending = [];
  conv.draft = "";
  $("input").value = "";
  autosize();
  save(conv);
  generate(conv, "new");
}

// ---------------------------------------------------------------- message actions

function copyText(text, button) {
  const done = () => {
    if (!button) return;
    const old = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = old), 1200);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text) && done());
  } else if (fallbackCopy(text)) done();
}

function fallbackCopy(text) {
  const ta = h("textarea", { value: text });
  ta.style.position = "fixed";
  ta.style.opacity = "0";
  document.body.append(ta);
  ta.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch {
    ok = false;
  }
  ta.remove();
  return ok;
}

function onMessageClick(e) {
  const button = e.target.closest("button");
  if (!button) {
    const det = e.target.closest("details.reasoning");
    if (det) det.dataset.touched = "1";
    return;
  }
  if (button.classList.contains("copy-code")) {
    copyText(button.closest(".code").querySelector("code").textContent, button);
    return;
  }
  const art = button.closest(".msg");
  const act = button.dataset.act;
  if (!art || !act || !state.conv) return;
  const conv = state.conv;
  const i = Number(art.dataset.index);
  const msg = conv.messages[i];
  if (!msg) return;
  switch (act) {
    case "copy":
      copyText(msg.role === "user" ? withAttachments(msg) : msg.content, button);
      break;
    case "edit":
      if (state.stream) return;
      state.editing = { index: i, text: msg.content };
      renderMessages();
      art.ownerDocument.querySelector(`.msg[data-index="${i}"] textarea.edit`)?.focus();
      break;
    case "cancel-edit":
      state.editing = null;
      renderMessages();
      break;
    case "save-edit": {
      const text = art.querySelector("textarea.edit").value;
      const edited = { ...msg, content: text };
      delete edited.error;
      delete edited.stopped;
      conv.messages = [...conv.messages.slice(0, i), edited];
      state.editing = null;
      save(conv);
      if (msg.role === "user" || msg.role === "tool") generate(conv, "edit");
      else renderAll();
      break;
    }
    case "regenerate":
      if (state.stream) return;
      conv.messages = conv.messages.slice(0, i);
      save(conv);
      generate(conv, "regenerate");
      break;
    case "retry":
      if (state.stream) return;
      conv.messages = conv.messages.slice(0, i + 1);
      save(conv);
      generate(conv, "regenerate");
      break;
    case "tool-result":
      state.toolReply = { index: i, call: Number(button.dataset.call) };
      renderMessages();
      art.ownerDocument.querySelector(".tool-input")?.focus();
      break;
    case "cancel-tool":
      state.toolReply = null;
      renderMessages();
      break;
    case "send-tool": {
      const call = msg.tool_calls[state.toolReply.call];
      const text = art.querySelector(".tool-input").value;
      state.toolReply = null;
      // The result goes right after the calls it answers (and their other results).
      let at = i + 1;
      while (at < conv.messages.length && conv.messages[at].role === "tool") at++;
      conv.messages = conv.messages.slice(0, at);
      conv.messages.push({ role: "tool", content: text, tool_call_id: call.id, name: call.function && call.function.name });
      save(conv);
      const open = msg.tool_calls.filter((c) => !answeredCalls(conv).has(c.id));
      if (open.length === 0) generate(conv, "tool");
      else renderAll();
      break;
    }
  }
}

// ---------------------------------------------------------------- the list

function onListClick(e) {
  const li = e.target.closest("li");
  if (!li) return;
  const id = li.dataset.id;
  const conv = store.getConversation(id);
  if (!conv) return;
  const act = e.target.closest("button")?.dataset.act;
  if (act === "rename") {
    state.renaming = id;
    renderList($("conversations"), store.listConversations(), state.conv && state.conv.id, id);
    const input = $("conversations").querySelector("input.rename");
    input.focus();
    input.select();
  } else if (act === "delete") {
    if (state.stream && state.stream.conv === conv) {
      notice("A reply is streaming in that conversation: stop it first.");
      return;
    }
    if (!window.confirm(`Delete “${conv.title}”? It is not kept anywhere else unless you exported it.`)) return;
    store.deleteConversation(id);
    if (state.conv && state.conv.id === id) {
      const next = store.listConversations()[0];
      if (next) openConversation(next);
      else newConversation();
    } else renderAll();
  } else if (act === "export") {
    download(`${slug(conv.title)}.json`, store.exportJson([conv]));
  } else if (!e.target.closest("input")) {
    openConversation(conv);
  }
}

function finishRename(commit) {
  const input = $("conversations").querySelector("input.rename");
  const id = state.renaming;
  state.renaming = null;
  if (commit && input && id) {
    const conv = store.getConversation(id);
    const title = input.value.trim().slice(0, 200);
    if (conv && title) {
      conv.title = title;
      save(conv, false);
    }
  }
  renderAll();
}

const slug = (s) => s.replace(/[^\w-]+/g, "-").replace(/^-|-$/g, "").slice(0, 60) || "chat";

function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function importFile(file) {
  try {
    const { added, skipped } = store.importJson(await file.text());
    notice(
      `Imported ${added.length} conversation${added.length === 1 ? "" : "s"}${skipped ? `; ${skipped} entries were not conversations and were skipped` : ""}.`,
      added.length ? "info" : "error",
    );
    if (added[0]) openConversation(added[0]);
  } catch (e) {
    notice(`Import of ${file.name} failed: ${e.message}`);
  }
}

// ---------------------------------------------------------------- attachments

async function attach(files) {
  const conv = state.conv;
  for (const file of files) {
    let text;
    try {
      text = await file.text();
    } catch (e) {
      notice(`Could not read ${file.name}: ${e.message}`);
      continue;
    }
    if (text.includes("\u0000")) {
      notice(`${file.name} is not a text file (it has NUL bytes): only text can be attached.`);
      continue;
    }
    if (text.length > MAX_ATTACHMENT) {
      notice(`${file.name} has ${num(text.length)} characters, more than the ${num(MAX_ATTACHMENT)} a page attachment may hold.`);
      continue;
    }
    conv.pending.push({ name: file.name, text });
  }
  save(conv, false);
  renderComposer();
}

// ---------------------------------------------------------------- composer

function autosize() {
  const ta = $("input");
  ta.style.height = "auto";
  ta.style.height = Math.min(ta.scrollHeight, window.innerHeight * 0.4) + "px";
}

let draftTimer = null;
function keepDraft() {
  clearTimeout(draftTimer);
  const conv = state.conv;
  draftTimer = setTimeout(() => {
    if (conv && conv.draft !== $("input").value && conv === state.conv) {
      conv.draft = $("input").value;
      save(conv, false);
    }
  }, 250);
}

// ---------------------------------------------------------------- wiring

function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("input").addEventListener("input", () => {
    autosize();
    keepDraft();
  });
  $("stop").addEventListener("click", () => state.stream && state.stream.ctrl.abort());
  $("attach").addEventListener("click", () => $("attach-file").click());
  $("attach-file").addEventListener("change", (e) => {
    attach([...e.target.files]);
    e.target.value = "";
  });
  $("main").addEventListener("dragover", (e) => e.preventDefault());
  $("main").addEventListener("drop", (e) => {
    e.preventDefault();
    if (e.dataTransfer && e.dataTransfer.files.length) attach([...e.dataTransfer.files]);
  });
  $("pending").addEventListener("click", (e) => {
    const b = e.target.closest('button[data-act="unattach"]');
    if (!b) return;
    e.preventDefault();
    state.conv.pending.splice(Number(b.dataset.k), 1);
    save(state.conv, false);
    renderComposer();
  });
  $("messages").addEventListener("click", onMessageClick);
  $("messages").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && e.target.matches("textarea.edit")) {
      e.preventDefault();
      e.target.closest(".msg").querySelector('[data-act="save-edit"],[data-act="send-tool"]')?.click();
    } else if (e.key === "Escape" && e.target.matches("textarea.edit")) {
      e.target.closest(".msg").querySelector('[data-act="cancel-edit"],[data-act="cancel-tool"]')?.click();
    }
  });

  $("new-chat").addEventListener("click", newConversation);
  $("conversations").addEventListener("click", onListClick);
  $("conversations").addEventListener("keydown", (e) => {
    if (!e.target.matches("input.rename")) return;
    if (e.key === "Enter") finishRename(true);
    else if (e.key === "Escape") finishRename(false);
  });
  $("conversations").addEventListener("focusout", (e) => {
    if (e.target.matches("input.rename") && state.renaming) finishRename(true);
  });
  $("title").addEventListener("dblclick", () => {
    if (!state.conv) return;
    document.body.classList.add("side-open");
    $("scrim").hidden = false;
    state.renaming = state.conv.id;
    renderList($("conversations"), store.listConversations(), state.conv.id, state.conv.id);
    $("conversations").querySelector("input.rename")?.focus();
  });
  $("export-all").addEventListener("click", () => {
    const d = new Date().toISOString().slice(0, 10);
    download(`coil-conversations-${d}.json`, store.exportJson(store.listConversations()));
  });
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (e) => {
    if (e.target.files[0]) importFile(e.target.files[0]);
    e.target.value = "";
  });
  $("theme").addEventListener("click", () => {
    const now = store.loadPref("theme", "system");
    store.savePref("theme", THEMES[(THEMES.indexOf(now) + 1) % THEMES.length]);
    applyTheme();
  });
  $("menu").addEventListener("click", () => {
    const open = !document.body.classList.contains("side-open");
    document.body.classList.toggle("side-open", open);
    $("scrim").hidden = !open;
  });
  $("scrim").addEventListener("click", () => {
    document.body.classList.remove("side-open");
    $("settings").hidden = true;
    $("scrim").hidden = true;
  });
  $("settings-button").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("scrim").hidden = s.hidden || window.innerWidth > 900;
  });
  $("settings-close").addEventListener("click", () => {
    $("settings").hidden = true;
    $("scrim").hidden = true;
  });
  for (const f of FIELDS) {
    $(`s-${f}`).addEventListener("input", (e) => {
      if (!state.conv) return;
      state.conv.settings[f] = e.target.value;
      save(state.conv, false);
      store.savePref("defaults", state.conv.settings);
      checkSettings();
    });
  }

  $("key-button").addEventListener("click", () =>
    askKey("The key this page sends (Authorization: Bearer) to a server started with --api-key.").then((key) => {
      if (key !== null) loadModel();
    }),
  );
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key-input").value.trim();
    setApiKey(key);
    store.savePref("apiKey", key);
    closeKey(key);
  });
  $("key-cancel").addEventListener("click", () => closeKey(null));
  $("key-clear").addEventListener("click", () => {
    setApiKey("");
    store.savePref("apiKey", "");
    $("key-input").value = "";
  });
  $("key-dialog").addEventListener("cancel", () => closeKey(null));
  window.addEventListener("beforeunload", () => {
    if (state.conv && state.conv.draft !== $("input").value) {
      state.conv.draft = $("input").value;
      save(state.conv, false);
    }
  });
}

function start() {
  applyTheme();
  setApiKey(store.loadPref("apiKey", ""));
  wire();
  const convs = store.listConversations();
  const current = store.getConversation(store.loadPref("current", "")) || convs[0];
  if (current) openConversation(current);
  else newConversation();
  loadModel();
}

// For the browser test: the renderer, reachable from the page's console.
window.coilRender = renderMarkdown;

start();
