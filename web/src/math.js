// A markdown-it plugin that finds TeX math — `$…$` and `\(…\)` inline,
// `$$…$$` and `\[…\]` as display — and hands it to `render(tex, display)`.
// The delimiter rules are pandoc's for `$`: an opening `$` is followed by a
// non-space, a closing one follows a non-space and is not followed by a
// digit; and the next `$` must close (so "costs $5 and $10" stays text).

const isSpace = (ch) => ch === " " || ch === "\t" || ch === "\n";
const isDigit = (ch) => ch >= "0" && ch <= "9";

function inlineMath(state, silent) {
  const src = state.src;
  const start = state.pos;
  let open, close, display;
  if (src.startsWith("\\(", start)) [open, close, display] = ["\\(", "\\)", false];
  else if (src.startsWith("\\[", start)) [open, close, display] = ["\\[", "\\]", true];
  else if (src.startsWith("$$", start)) [open, close, display] = ["$$", "$$", true];
  else if (src[start] === "$") [open, close, display] = ["$", "$", false];
  else return false;

  const from = start + open.length;
  if (open === "$" && (from >= src.length || isSpace(src[from]))) return false;
  let end = src.indexOf(close, from);
  if (open === "$") {
    // An escaped `\$` is part of the math; the first other `$` must close it.
    while (end !== -1 && src[end - 1] === "\\") end = src.indexOf(close, end + 1);
    if (end !== -1 && (isSpace(src[end - 1]) || isDigit(src[end + 1] || ""))) return false;
  }
  if (end === -1 || end === from) return false;
  if (!silent) {
    const token = state.push(display ? "math_display" : "math_inline", "math", 0);
    token.content = src.slice(from, end);
    token.markup = open;
  }
  state.pos = end + close.length;
  return true;
}

function blockMath(state, startLine, endLine, silent) {
  const lineText = (n) => state.src.slice(state.bMarks[n] + state.tShift[n], state.eMarks[n]);
  if (state.sCount[startLine] - state.blkIndent >= 4) return false;
  const first = lineText(startLine);
  let close;
  if (first.startsWith("$$")) close = "$$";
  else if (first.startsWith("\\[")) close = "\\]";
  else return false;

  let body = first.slice(2);
  let last = startLine;
  let found = false;
  const tail = body.trimEnd();
  if (tail.endsWith(close)) {
    body = tail.slice(0, -close.length);
    found = true;
  } else {
    const lines = [body];
    for (let n = startLine + 1; n < endLine; n++) {
      const text = lineText(n);
      if (state.sCount[n] < state.blkIndent && text.length > 0) break;
      const t = text.trimEnd();
      if (t.endsWith(close)) {
        lines.push(t.slice(0, -close.length));
        last = n;
        found = true;
        break;
      }
      lines.push(text);
    }
    body = lines.join("\n");
  }
  if (!found || body.trim() === "") return false;
  if (silent) return true;
  const token = state.push("math_block", "math", 0);
  token.block = true;
  token.content = body.trim();
  token.map = [startLine, last + 1];
  token.markup = close;
  state.line = last + 1;
  return true;
}

export function mathPlugin(md, { render }) {
  md.inline.ruler.before("escape", "math_inline", inlineMath);
  md.block.ruler.before("fence", "math_block", blockMath, {
    alt: ["paragraph", "reference", "blockquote", "list"],
  });
  md.renderer.rules.math_inline = (tokens, i) => render(tokens[i].content, false);
  md.renderer.rules.math_display = (tokens, i) => render(tokens[i].content, true);
  md.renderer.rules.math_block = (tokens, i) =>
    `<div class="math-block">${render(tokens[i].content, true)}</div>\n`;
}
