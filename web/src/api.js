// The page's calls to its server: `/v1/models` and streamed
// `/v1/chat/completions` (server-sent events, with the usage chunk that
// `stream_options.include_usage` asks for). Every failure becomes an
// ApiError whose message a person can read.

export class ApiError extends Error {
  constructor(message, { status = 0, code = null, partial = false } = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.partial = partial; // the reply had begun
  }
}

let apiKey = "";
export const setApiKey = (key) => {
  apiKey = key || "";
};

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

async function errorOf(res) {
  let message = `${res.status} ${res.statusText}`.trim();
  let code = null;
  try {
    const body = await res.text();
    try {
      const e = JSON.parse(body).error;
      if (e && e.message) message = e.message;
      code = (e && e.code) || null;
    } catch {
      if (body.trim()) message = body.trim().slice(0, 500);
    }
  } catch {
    /* the status alone */
  }
  const prefix = res.status === 401 ? "The server wants an API key" : `The server answered ${res.status}`;
  return new ApiError(`${prefix}: ${message}`, { status: res.status, code });
}

function unreachable(e) {
  return new ApiError(`Could not reach the server (${e.message || e}). Is coil serve still running?`);
}

export async function getModel() {
  let res;
  try {
    res = await fetch("v1/models", { headers: headers() });
  } catch (e) {
    throw unreachable(e);
  }
  if (!res.ok) throw await errorOf(res);
  const body = await res.json();
  const m = (body.data && body.data[0]) || {};
  return { id: m.id || "model", n_ctx: (m.meta && m.meta.n_ctx) || null };
}

/**
 * Streams a chat completion. `on(event)` receives
 *   { type: "first" }                       the first token's arrival
 *   { type: "delta", content?, reasoning?, tool_calls? }
 *   { type: "finish", reason }
 *   { type: "usage", usage }
 * Resolves when the stream ends with [DONE]; rejects with ApiError
 * (`partial` when it broke off mid-reply). `signal` aborts (a DOMException
 * named AbortError, passed through).
 */
export async function streamChat(body, on, signal) {
  let res;
  try {
    res = await fetch("v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      signal,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw unreachable(e);
  }
  if (!res.ok) throw await errorOf(res);
  if (!res.body) throw new ApiError("The server's answer has no body.");

  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let began = false;
  let done = false;
  const handle = (data) => {
    if (data === "[DONE]") {
      done = true;
      return;
    }
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      throw new ApiError(`The server sent something unreadable in the stream: ${data.slice(0, 200)}`, { partial: began });
    }
    if (chunk.error) {
      const e = chunk.error;
      throw new ApiError(`The server stopped the reply: ${e.message || JSON.stringify(e)}`, {
        code: e.code || null,
        partial: began,
      });
    }
    if (chunk.usage) on({ type: "usage", usage: chunk.usage });
    for (const choice of chunk.choices || []) {
      const d = choice.delta || {};
      const ev = { type: "delta" };
      if (d.content) ev.content = d.content;
      if (d.reasoning_content) ev.reasoning = d.reasoning_content;
      if (Array.isArray(d.tool_calls) && d.tool_calls.length) ev.tool_calls = d.tool_calls;
      if (ev.content || ev.reasoning || ev.tool_calls) {
        if (!began) {
          began = true;
          on({ type: "first" });
        }
        on(ev);
      }
      if (choice.finish_reason) on({ type: "finish", reason: choice.finish_reason });
    }
  };
  try {
    for (;;) {
      let step;
      try {
        step = await reader.read();
      } catch (e) {
        if (e.name === "AbortError") throw e;
        throw new ApiError(`The connection dropped in the middle of the reply (${e.message || e}).`, {
          partial: began,
        });
      }
      if (step.done) break;
      buffer += decoder.decode(step.value, { stream: true });
      // Events end with a blank line; each `data:` line is one chunk.
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) !== -1) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event
          .split(/\r?\n/)
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data) handle(data);
        if (done) return;
      }
    }
  } finally {
    reader.releaseLock?.();
  }
  if (!done) {
    throw new ApiError("The connection dropped before the reply ended; what arrived is kept.", {
      partial: began,
    });
  }
}
