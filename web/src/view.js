// DOM for the conversation list and the messages (no state of its own).

import { escapeHtml, renderMarkdown } from "./markdown.js";

export const $ = (id) => document.getElementById(id);

/** `h("div.a.b", {attrs}, children…)`: an element; strings become text. */
export function h(tag, attrs = {}, ...children) {
  const [name, ...classes] = tag.split(".");
  const el = document.createElement(name);
  if (classes.length) el.className = classes.join(" ");
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") el.textContent = v;
    else if (k === "html") el.innerHTML = v; // only renderer output, never raw text
    else if (k.startsWith("data-") || k === "title" || k === "type" || k.startsWith("aria-") || k === "role")
      el.setAttribute(k, v === true ? "" : String(v));
    else el[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Appends the nodes that are not null. */
export function put(el, ...nodes) {
  for (const n of nodes) if (n !== null && n !== undefined && n !== false) el.append(n);
  return el;
}

const nf = new Intl.NumberFormat("en-US");
export const num = (n) => nf.format(n);

/** The conversation list of the sidebar. */
export function renderList(ul, convs, currentId, renamingId) {
  ul.replaceChildren(
    ...convs.map((c) => {
      const current = c.id === currentId;
      const title =
        c.id === renamingId
          ? h("input.rename", { value: c.title, "aria-label": "New name", "data-id": c.id })
          : h("span.conv-title", { text: c.title, title: c.title });
      return h(
        "li",
        { "data-id": c.id, className: current ? "current" : "" },
        title,
        h(
          "span.conv-actions",
          {},
          h("button.icon.small", { type: "button", "data-act": "rename", title: "Rename", "aria-label": "Rename" }, "✎"),
          h("button.icon.small", { type: "button", "data-act": "export", title: "Export as JSON", "aria-label": "Export" }, "⤓"),
          h("button.icon.small", { type: "button", "data-act": "delete", title: "Delete", "aria-label": "Delete" }, "✕"),
        ),
      );
    }),
  );
}

/** The user-facing text of a user message's attachments plus its content (what the model sees). */
export function withAttachments(msg) {
  const parts = (msg.attachments || []).map((a) => {
    const longest = Math.max(2, ...(a.text.match(/`+/g) || []).map((s) => s.length));
    const fence = "`".repeat(longest + 1);
    return `${a.name}:\n${fence}\n${a.text.replace(/\n$/, "")}\n${fence}`;
  });
  if (msg.content) parts.push(msg.content);
  return parts.join("\n\n");
}

/** The figures under a reply: what only coil shows is the first line. */
export function statsEl(stats) {
  if (!stats) return null;
  const lines = [];
  const { prompt_tokens: prompt, cached_tokens: cached } = stats;
  if (Number.isFinite(prompt)) {
    const processed = prompt - (cached || 0);
    const resumed = stats.kind === "regenerate" || stats.kind === "edit";
    let text;
    if (resumed && cached > 0) {
      text = `↻ resumed at token ${num(cached)} of ${num(prompt)}: ${num(processed)} processed, the rest not re-processed`;
    } else if (cached > 0) {
      text = `prompt ${num(prompt)} tokens: ${num(cached)} reused from the cache, ${num(processed)} processed`;
    } else {
      text = `prompt ${num(prompt)} tokens, all processed (nothing cached)`;
    }
    const pct = prompt > 0 ? Math.round((100 * (cached || 0)) / prompt) : 0;
    const bar = h("span.bar", { title: `${pct}% of the prompt reused` }, h("span"));
    bar.firstChild.style.width = `${pct}%`;
    lines.push(
      h(
        "div.cache" + (resumed && cached > 0 ? ".resumed" : ""),
        { "data-prompt": prompt, "data-cached": cached || 0, "data-kind": stats.kind || "new" },
        bar,
        text,
      ),
    );
  }
  const bits = [];
  if (Number.isFinite(stats.ttft_ms)) bits.push(`first token ${num(Math.round(stats.ttft_ms))} ms`);
  if (Number.isFinite(stats.completion_tokens)) {
    let s = `${num(stats.completion_tokens)} tokens`;
    if (stats.completion_tokens > 1 && stats.gen_ms > 0) {
      const tps = ((stats.completion_tokens - 1) * 1000) / stats.gen_ms;
      s += ` at ${tps.toFixed(tps >= 100 ? 0 : 1)} tokens/s`;
    }
    bits.push(s);
  }
  if (stats.finish && stats.finish !== "stop") bits.push(`ended: ${stats.finish}`);
  if (bits.length) lines.push(h("div.speed", {}, bits.join(" · ")));
  return lines.length ? h("div.stats", {}, ...lines) : null;
}

function toolCallsEl(calls, answered) {
  return h(
    "div.tool-calls",
    {},
    ...calls.map((call, k) => {
      const fn = call.function || {};
      let args = fn.arguments || "";
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch {
        /* shown as it came */
      }
      const done = answered.has(call.id);
      return h(
        "div.tool-call",
        { "data-call": k },
        h("div.tool-head", {}, h("span.badge", {}, "tool call"), h("code", {}, fn.name || "?"), call.id ? h("small", {}, call.id) : null),
        h("pre", {}, h("code", { text: args })),
        done ? null : h("button.small", { type: "button", "data-act": "tool-result", "data-call": k }, "Add result"),
      );
    }),
  );
}

function attachmentsEl(list, removable) {
  if (!list || !list.length) return null;
  return h(
    "div.chips",
    {},
    ...list.map((a, k) =>
      h(
        "details.chip",
        {},
        h("summary", {}, a.name, h("small", {}, ` ${num(a.text.length)} chars`)),
        removable ? h("button.icon.small", { type: "button", "data-act": "unattach", "data-k": k, "aria-label": "Remove" }, "✕") : null,
        h("pre", { text: a.text.length > 20000 ? a.text.slice(0, 20000) + "\n…" : a.text }),
      ),
    ),
  );
}

export const pendingEl = (list) => attachmentsEl(list, true);

/**
 * One message. `ctx`: { model, streamingIndex, editing: {index, text} | null,
 * answered: Set of tool call ids with results, last: index of the last message }.
 */
export function messageEl(msg, i, ctx) {
  const streaming = ctx.streamingIndex === i;
  const el = h("article.msg." + msg.role, { "data-index": i });
  if (streaming) el.classList.add("streaming");
  const who =
    msg.role === "user" ? "You" : msg.role === "tool" ? `Tool result${msg.name ? " · " + msg.name : ""}` : ctx.model || "Assistant";
  put(el, h("div.role", {}, who));

  if (ctx.editing && ctx.editing.index === i) {
    const ta = h("textarea.edit", { value: ctx.editing.text, rows: Math.min(16, ctx.editing.text.split("\n").length + 1) });
    put(el, 
      attachmentsEl(msg.attachments, false),
      ta,
      h(
        "div.actions.editing",
        {},
        h("button.primary.small", { type: "button", "data-act": "save-edit" }, msg.role === "user" ? "Save & send" : "Save"),
        h("button.small", { type: "button", "data-act": "cancel-edit" }, "Cancel"),
      ),
    );
    return el;
  }

  if (msg.role === "assistant" && msg.reasoning) {
    const det = h("details.reasoning", { open: streaming && !msg.content }, h("summary", {}, streaming && !msg.content ? "Reasoning…" : "Reasoning"));
    put(det, h("div.md", { html: renderMarkdown(msg.reasoning) }));
    put(el, det);
  }
  if (msg.role === "user") {
    put(el, attachmentsEl(msg.attachments, false));
    if (msg.content) put(el, h("div.text", { text: msg.content }));
  } else if (msg.role === "tool") {
    put(el, h("pre.tool-result", { text: msg.content }));
  } else if (msg.content || streaming) {
    put(el, h("div.md.content", { html: renderMarkdown(msg.content) }));
  }
  if (msg.tool_calls && msg.tool_calls.length) put(el, toolCallsEl(msg.tool_calls, ctx.answered));
  if (streaming && !msg.content && !msg.reasoning && !(msg.tool_calls && msg.tool_calls.length)) {
    put(el, h("div.waiting", {}, "waiting for the first token…"));
  }
  if (msg.stopped) put(el, h("div.note", {}, "stopped"));
  if (msg.error) put(el, h("div.error", { role: "alert" }, msg.error));
  if (!streaming) put(el, statsEl(msg.stats));

  if (!streaming && !ctx.busy) {
    const acts = [];
    if (msg.role !== "tool") acts.push(h("button.small", { type: "button", "data-act": "copy" }, "Copy"));
    acts.push(h("button.small", { type: "button", "data-act": "edit" }, "Edit"));
    if (msg.role === "assistant") acts.push(h("button.small", { type: "button", "data-act": "regenerate" }, "Regenerate"));
    if (msg.role !== "assistant" && i === ctx.last) acts.push(h("button.small", { type: "button", "data-act": "retry" }, "Send again"));
    put(el, h("div.actions", {}, ...acts));
  }
  return el;
}

/** Replaces the body of a streaming message cheaply (no re-render of the list). */
export function updateStreaming(el, msg, ctx) {
  const fresh = messageEl(msg, Number(el.dataset.index), ctx);
  // Keep a reasoning block the reader opened or closed as they left it.
  const oldDet = el.querySelector("details.reasoning");
  const newDet = fresh.querySelector("details.reasoning");
  if (oldDet && newDet && oldDet.dataset.touched) {
    newDet.open = oldDet.open;
    newDet.dataset.touched = "1";
  }
  el.replaceWith(fresh);
  return fresh;
}

export { escapeHtml };
