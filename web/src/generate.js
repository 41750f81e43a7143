// Streams a reply into a conversation and keeps what the server reports
// about it: time to first token, tokens/s, and the prompt tokens it reused
// from its cache.

import { ApiError, streamChat } from "./api.js";
import { askKey } from "./key.js";
import { msgCtx, nearBottom, renderAll, scrollDown } from "./page.js";
import { requestMessages, requestSettings } from "./request.js";
import { notice, save, state } from "./state.js";
import { updateStreaming } from "./view.js";

/** Streams a reply to the conversation as it stands; `kind` is new / regenerate / edit / tool. */
export async function generate(conv, kind) {
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
