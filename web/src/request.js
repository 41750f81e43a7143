// A conversation as a chat request: its messages in OpenAI's shape and the
// sampling fields its settings ask for.

import { withAttachments } from "./view.js";

export const FIELDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "tools"];

/** The sampling fields of a request, or an Error naming the bad one. */
export function requestSettings(s) {
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

export function requestMessages(conv, upto) {
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
