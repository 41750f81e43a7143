// What the buttons on a message do: copy, edit, regenerate, send again,
// answer a tool call.

import { generate } from "./generate.js";
import { answeredCalls, renderAll, renderMessages } from "./page.js";
import { save, state } from "./state.js";
import { h, withAttachments } from "./view.js";

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

export function onMessageClick(e) {
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
