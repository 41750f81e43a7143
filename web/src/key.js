// The API key: asked for when the server answers 401, kept in the
// browser's storage, sent with every call.

import { getModel, setApiKey } from "./api.js";
import { renderMessages } from "./page.js";
import { notice, state } from "./state.js";
import * as store from "./store.js";
import { $, num } from "./view.js";

let keyResolve = null;

export function askKey(why) {
  $("key-why").textContent = why || "This server was started with --api-key.";
  $("key-input").value = store.loadPref("apiKey", "");
  const d = $("key-dialog");
  if (!d.open) d.showModal();
  $("key-input").focus();
  return new Promise((resolve) => {
    keyResolve = resolve;
  });
}

export function closeKey(key) {
  const d = $("key-dialog");
  if (d.open) d.close();
  if (keyResolve) keyResolve(key);
  keyResolve = null;
}

export async function loadModel() {
  for (;;) {
    try {
      state.model = await getModel();
      $("model").textContent = state.model.id + (state.model.n_ctx ? ` · ctx ${num(state.model.n_ctx)}` : "");
      $("model").title = "The model this server runs";
      renderMessages();
      return;
    } catch (e) {
      $("model").textContent = "not connected";
      $("model").title = e.message;
      if (e.status === 401) {
        const key = await askKey(e.message);
        if (key === null) return;
        continue;
      }
      notice(e.message);
      return;
    }
  }
}

/** The dialog's buttons. */
export function wireKey() {
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key-input").value.trim();
    setApiKey(key);
    store.savePref("apiKey", key);
    closeKey(key);
  });
  $("key-cancel").addEventListener("click", () => closeKey(null));
  $("key-clear").addEventListener("click", () => {
    setApiKey("");
    store.savePref("apiKey", "");
    $("key-input").value = "";
  });
  $("key-dialog").addEventListener("cancel", () => closeKey(null));
}
