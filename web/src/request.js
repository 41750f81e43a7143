// A conversation as a chat request: its messages in OpenAI's shape and the
// sampling and structured-output fields its settings ask for.

import { withAttachments } from "./view.js";

export const FIELDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "tools", "format", "format_spec"];

/** The output formats a conversation may ask for (the settings' `format`). */
export const FORMATS = ["", "json_object", "json_schema", "grammar"];

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
  Object.assign(out, outputFormat(s.format || "", String(s.format_spec || "")));
  return out;
}

/** `response_format` or `grammar` for the structured-output settings. */
function outputFormat(format, spec) {
  if (!FORMATS.includes(format)) throw new Error(`unknown response format "${format}"`);
  if (format === "json_object") return { response_format: { type: "json_object" } };
  if (format === "json_schema") {
    if (!spec.trim()) throw new Error("JSON schema: write the schema the reply must follow");
    let schema;
    try {
      schema = JSON.parse(spec);
    } catch (e) {
      throw new Error(`JSON schema is not JSON: ${e.message}`);
    }
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      throw new Error("JSON schema must be a JSON object");
    }
    return { response_format: { type: "json_schema", json_schema: { name: "reply", schema, strict: true } } };
  }
  if (format === "grammar") {
    if (!spec.trim()) throw new Error("GBNF grammar: write the grammar the reply must follow (root ::= …)");
    return { grammar: spec };
  }
  return {};
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
