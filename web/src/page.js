// Draws the page from the state: the list, the title, the messages, the
// settings and the composer.

import * as store from "./store.js";
import { FIELDS, requestSettings } from "./request.js";
import { state } from "./state.js";
import { $, h, messageEl, num, pendingEl, renderList } from "./view.js";

export function renderAll() {
  renderList($("conversations"), store.listConversations(), state.conv && state.conv.id, state.renaming);
  renderTitle();
  renderMessages();
  renderSettings();
  renderComposer();
}

export function renderTitle() {
  $("title").textContent = state.conv ? state.conv.title : "";
  const stats = (state.conv ? state.conv.messages : []).map((m) => m.stats).filter((s) => s && Number.isFinite(s.prompt_tokens));
  const prompt = stats.reduce((a, s) => a + s.prompt_tokens, 0);
  const cached = stats.reduce((a, s) => a + (s.cached_tokens || 0), 0);
  $("summary").textContent = prompt ? `cache: ${Math.round((100 * cached) / prompt)}% of ${num(prompt)} prompt tokens reused` : "";
}

export function answeredCalls(conv) {
  return new Set(conv.messages.filter((m) => m.role === "tool" && m.tool_call_id).map((m) => m.tool_call_id));
}

export function msgCtx() {
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

export function renderMessages() {
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
        h("p.hint", {}, "Conversations stay in this browser. Settings (⚙): system prompt, sampling, tools, response format."),
      ),
    );
  }
  box.replaceChildren(...els);
  if (state.stream && state.stream.conv === state.conv) {
    state.stream.el = box.querySelector(`.msg[data-index="${ctx.streamingIndex}"]`);
  }
}

export function renderComposer() {
  const busy = Boolean(state.stream);
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("pending").replaceChildren(...[pendingEl(state.conv ? state.conv.pending : [])].filter(Boolean));
}

export function renderSettings() {
  if (!state.conv) return;
  for (const f of FIELDS) {
    const el = $(`s-${f}`);
    if (document.activeElement !== el) el.value = state.conv.settings[f] ?? "";
  }
  // The schema or grammar box, for the formats that take one.
  const format = state.conv.settings.format || "";
  const spec = format === "json_schema" || format === "grammar";
  $("s-format_spec-label").hidden = !spec;
  $("s-format_spec-name").textContent = format === "grammar" ? "GBNF grammar" : "JSON schema";
  $("s-format_spec").placeholder =
    format === "grammar" ? 'root ::= "yes" | "no"' : '{"type": "object", "properties": {…}, "required": […]}';
  checkSettings();
}

/** The sampling fields of a request, or an Error naming the bad one. */

export function nearBottom() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

export function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

/** Shows what is wrong with the settings, if anything; whether they are usable. */
export function checkSettings() {
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

/** The message box grows with its text, up to 40% of the screen. */
export function autosize() {
  const ta = $("input");
  ta.style.height = "auto";
  ta.style.height = Math.min(ta.scrollHeight, window.innerHeight * 0.4) + "px";
}
