// Model output to HTML: Markdown (markdown-it), code highlighting
// (highlight.js, a few common languages) and TeX math (Temml, MathML).
//
// Safety: the text is the model's, so nothing in it may run. markdown-it
// with `html: false` writes raw HTML in the text as escaped text; its link
// check refuses javascript:, vbscript:, file: and (but for images) data:
// URLs; images are shown as links (a remote image would be a request the
// page did not choose). Code goes through highlight.js, which escapes it; math through
// Temml with `trust: false` (no \href, \class, \data). The page's
// Content-Security-Policy is a second wall: only its own script runs.

import MarkdownIt from "markdown-it";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import temml from "temml";
import { mathPlugin } from "./math.js";

const LANGUAGES = {
  bash, c, cpp, css, diff, go, java, javascript, json, python, rust, sql, typescript, xml, yaml,
};
for (const [name, def] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, def);

export const escapeHtml = (s) =>
  String(s).replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);

const md = new MarkdownIt({
  html: false,
  linkify: true,
  breaks: false,
  highlight: () => "", // fences are written by the rule below
});
md.disable("image");
md.use(mathPlugin, { render: renderMath });

// Links open elsewhere and tell the other side nothing.
const defaultLinkOpen =
  md.renderer.rules.link_open || ((tokens, i, opts, env, self) => self.renderToken(tokens, i, opts));
md.renderer.rules.link_open = (tokens, i, opts, env, self) => {
  tokens[i].attrSet("target", "_blank");
  tokens[i].attrSet("rel", "noopener noreferrer nofollow");
  return defaultLinkOpen(tokens, i, opts, env, self);
};

// A fenced block: a bar with its language and a copy button, then the
// highlighted code (a language highlight.js does not know stays plain).
md.renderer.rules.fence = (tokens, i) => {
  const token = tokens[i];
  const lang = (token.info || "").trim().split(/\s+/)[0].toLowerCase();
  const code = token.content;
  let body;
  if (lang && hljs.getLanguage(lang)) {
    body = hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
  } else {
    body = escapeHtml(code);
  }
  const label = escapeHtml(lang || "text");
  return (
    `<div class="code"><div class="code-bar"><span>${label}</span>` +
    `<button type="button" class="copy-code">Copy</button></div>` +
    `<pre><code class="hljs">${body}</code></pre></div>\n`
  );
};

function renderMath(tex, displayMode) {
  try {
    return temml.renderToString(tex, {
      displayMode,
      throwOnError: true,
      trust: false,
      maxSize: 50,
      maxExpand: 500,
    });
  } catch {
    // Not TeX after all (or TeX Temml cannot read): the source, as code.
    const delim = displayMode ? "$$" : "$";
    return `<code class="math-error" title="not rendered as math">${escapeHtml(delim + tex + delim)}</code>`;
  }
}

/** The HTML of `text` (Markdown with code and math). */
export function renderMarkdown(text) {
  return md.render(text || "");
}

/** Whether highlight.js knows `lang` (the tests ask). */
export const knowsLanguage = (lang) => Boolean(hljs.getLanguage(lang));
