// Conversations in the browser's local storage, one key each
// (`coil.conv.<id>`), plus the page's preferences. Nothing leaves the
// browser but the requests the page makes to its own server.
//
// A conversation: { id, title, created, updated, settings, draft, pending,
//   messages: [{ role: "user"|"assistant"|"tool", content, reasoning?,
//   tool_calls?, tool_call_id?, attachments?: [{name, text}], stats?, error? }] }

const PREFIX = "coil.conv.";
const FORMAT = "coil-chat";

export const DEFAULT_SETTINGS = {
  system: "",
  temperature: "",
  top_p: "",
  top_k: "",
  min_p: "",
  max_tokens: "",
  seed: "",
  tools: "",
  // Structured output: "" (free text), "json_object", "json_schema" or
  // "grammar"; `format_spec` holds the schema (JSON) or the GBNF grammar.
  format: "",
  format_spec: "",
};

const cache = new Map();

export function newId() {
  const rnd = crypto.getRandomValues(new Uint32Array(2));
  return Date.now().toString(36) + rnd[0].toString(36) + rnd[1].toString(36);
}

export function loadPref(name, fallback) {
  try {
    const v = localStorage.getItem("coil." + name);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

export function savePref(name, value) {
  try {
    localStorage.setItem("coil." + name, JSON.stringify(value));
  } catch {
    /* a preference that cannot be kept is not worth an error */
  }
}

/** Every conversation, newest first. */
export function listConversations() {
  for (let i = 0; i < localStorage.length; i++) {
    const key = localStorage.key(i);
    if (!key || !key.startsWith(PREFIX)) continue;
    const id = key.slice(PREFIX.length);
    if (cache.has(id)) continue;
    try {
      const conv = normalise(JSON.parse(localStorage.getItem(key)));
      if (conv && conv.id === id) cache.set(id, conv);
    } catch {
      /* an unreadable entry is skipped, not deleted */
    }
  }
  return [...cache.values()].sort((a, b) => b.updated - a.updated);
}

export function getConversation(id) {
  listConversations();
  return cache.get(id) || null;
}

export function createConversation(settings) {
  const now = Date.now();
  const conv = {
    id: newId(),
    title: "New chat",
    created: now,
    updated: now,
    settings: { ...DEFAULT_SETTINGS, ...settings },
    draft: "",
    pending: [],
    messages: [],
  };
  cache.set(conv.id, conv);
  return conv;
}

/**
 * Writes `conv` (and bumps its time when `touch`). Throws an Error with a
 * readable message when the browser's storage is full.
 */
export function saveConversation(conv, touch = true) {
  if (touch) conv.updated = Date.now();
  cache.set(conv.id, conv);
  try {
    localStorage.setItem(PREFIX + conv.id, JSON.stringify(conv));
  } catch (e) {
    throw new Error(
      `This browser's storage is full (${e.name}): the conversation is kept while the page is open; export and delete old conversations to keep it.`,
    );
  }
}

export function deleteConversation(id) {
  cache.delete(id);
  localStorage.removeItem(PREFIX + id);
}

/** The JSON an export writes. */
export function exportJson(convs) {
  return JSON.stringify({ format: FORMAT, version: 1, conversations: convs }, null, 2);
}

const str = (v) => (typeof v === "string" ? v : "");

/** A conversation read from storage or a file, with its fields checked; null if it is not one. */
export function normalise(c) {
  if (!c || typeof c !== "object" || !Array.isArray(c.messages)) return null;
  const messages = [];
  for (const m of c.messages) {
    if (!m || typeof m !== "object" || !["user", "assistant", "tool", "system"].includes(m.role)) return null;
    const msg = { role: m.role, content: typeof m.content === "string" ? m.content : contentText(m.content) };
    if (m.reasoning || m.reasoning_content) msg.reasoning = str(m.reasoning || m.reasoning_content);
    if (Array.isArray(m.tool_calls) && m.tool_calls.length) msg.tool_calls = m.tool_calls;
    if (m.tool_call_id) msg.tool_call_id = str(m.tool_call_id);
    if (m.name) msg.name = str(m.name);
    if (Array.isArray(m.attachments)) {
      msg.attachments = m.attachments
        .filter((a) => a && typeof a.text === "string")
        .map((a) => ({ name: str(a.name) || "file", text: a.text }));
    }
    if (m.stats && typeof m.stats === "object") msg.stats = m.stats;
    if (m.error) msg.error = str(m.error);
    if (m.stopped) msg.stopped = true;
    if (m.streaming) msg.streaming = true;
    messages.push(msg);
  }
  // An OpenAI-style message list may carry the system prompt as its first message.
  const settings = { ...DEFAULT_SETTINGS };
  if (c.settings && typeof c.settings === "object") {
    for (const k of Object.keys(DEFAULT_SETTINGS)) {
      if (c.settings[k] !== undefined && c.settings[k] !== null) settings[k] = String(c.settings[k]);
    }
  }
  while (messages.length && messages[0].role === "system") {
    settings.system = settings.system || messages[0].content;
    messages.shift();
  }
  const now = Date.now();
  return {
    id: typeof c.id === "string" && /^[\w-]{1,64}$/.test(c.id) ? c.id : newId(),
    title: str(c.title).slice(0, 200) || "Imported chat",
    created: Number.isFinite(c.created) ? c.created : now,
    updated: Number.isFinite(c.updated) ? c.updated : now,
    settings,
    draft: str(c.draft),
    pending: Array.isArray(c.pending) ? c.pending.filter((a) => a && typeof a.text === "string") : [],
    messages,
  };
}

// OpenAI's content may be a list of parts; the text parts are kept.
function contentText(content) {
  if (!Array.isArray(content)) return "";
  return content
    .filter((p) => p && p.type === "text" && typeof p.text === "string")
    .map((p) => p.text)
    .join("\n");
}

/**
 * Conversations from an export (this page's format, a list of
 * conversations, or one). Returns { added: [conv], skipped: n }; ids already
 * here get new ones.
 */
export function importJson(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${e.message}`);
  }
  const list = Array.isArray(data)
    ? data
    : Array.isArray(data && data.conversations)
      ? data.conversations
      : [data];
  const added = [];
  let skipped = 0;
  for (const item of list) {
    const conv = normalise(item);
    if (!conv) {
      skipped++;
      continue;
    }
    if (cache.has(conv.id) || localStorage.getItem(PREFIX + conv.id) !== null) conv.id = newId();
    saveConversation(conv, false);
    added.push(conv);
  }
  return { added, skipped };
}
