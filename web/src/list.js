// The conversation list: open, start, rename, delete, export and import.

import { autosize, renderAll } from "./page.js";
import { notice, save, state } from "./state.js";
import * as store from "./store.js";
import { $, h, renderList } from "./view.js";

function settingsDefaults() {
  return store.loadPref("defaults", {});
}

export function openConversation(conv) {
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

export function newConversation() {
  // An empty conversation is reused rather than piling up.
  const empty = store.listConversations().find((c) => c.messages.length === 0 && !c.draft && !c.pending.length);
  const conv = empty || store.createConversation(settingsDefaults());
  if (!empty) save(conv);
  openConversation(conv);
  $("input").focus();
}

export function onListClick(e) {
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

export function finishRename(commit) {
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

export function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export async function importFile(file) {
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
