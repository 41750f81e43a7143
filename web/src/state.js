// What the page is showing and doing, shared by its modules, and the two
// things every module may do with it: tell the reader, keep a conversation.

import * as store from "./store.js";
import { $ } from "./view.js";

export const state = {
  conv: null, // the conversation shown
  model: null, // { id, n_ctx }
  stream: null, // { conv, msg, ctrl, el } while a reply streams
  editing: null, // { index, text }
  renaming: null, // id of the conversation being renamed
  toolReply: null, // { index, call } while a tool result is typed
};

export function notice(text, kind = "error") {
  const n = $("notice");
  n.textContent = text;
  n.className = `notice ${kind}`;
  n.hidden = !text;
}

export function save(conv, touch = true) {
  try {
    store.saveConversation(conv, touch);
  } catch (e) {
    notice(e.message);
  }
}
