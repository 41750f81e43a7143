// The chat page: conversations kept in the browser, replies streamed from
// the server, and under each reply what the server's prefix cache saved.
// This module wires the page's controls to the modules that act:
// generate.js (a reply), actions.js (a message's buttons), list.js (the
// conversations), key.js (the API key), page.js (drawing).

import { onMessageClick } from "./actions.js";
import { setApiKey } from "./api.js";
import { generate } from "./generate.js";
import { askKey, loadModel, wireKey } from "./key.js";
import { download, finishRename, importFile, newConversation, onListClick, openConversation } from "./list.js";
import { autosize, checkSettings, renderComposer, renderSettings } from "./page.js";
import { FIELDS } from "./request.js";
import { notice, save, state } from "./state.js";
import * as store from "./store.js";
import { $, num, renderList } from "./view.js";

// Local storage holds about 5 million characters per server, all
// conversations together.
const MAX_ATTACHMENT = 1 << 20; // characters

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
    $("scrim").hidden = window.innerWidth > 700;
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
      if (f === "format") renderSettings();
      else checkSettings();
    });
  }

  $("key-button").addEventListener("click", () =>
    askKey("The key this page sends (Authorization: Bearer) to a server started with --api-key.").then((key) => {
      if (key !== null) loadModel();
    }),
  );
  wireKey();
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

start();
