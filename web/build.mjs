// Bundles src/ (the page's script and styles, with markdown-it, highlight.js
// and Temml) into ../crates/coil-server/assets/chat.html: the template
// src/index.html with the script and the styles inlined and a
// Content-Security-Policy that lets only that script run (by its hash) and
// only the serving origin be fetched. Prints the asset's size, raw and gzip.
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const out = new URL("../crates/coil-server/assets/chat.html", import.meta.url);

async function bundle(entry) {
  const r = await build({
    entryPoints: [new URL(entry, import.meta.url).pathname],
    bundle: true,
    minify: true,
    format: "iife",
    target: ["chrome109", "firefox115", "safari16.4"],
    legalComments: "none",
    charset: "utf8",
    write: false,
    // Temml's one font (script capitals, primes), inlined.
    loader: { ".woff2": "dataurl" },
    logLevel: "warning",
  });
  return r.outputFiles[0].text.trim();
}

// Inside <script>, the HTML parser reacts to `</script`, `<!--` and
// `<script` even in JS strings and regular expressions; written with an
// escape (`\/`, `\x3C`), which means the same there, they are inert.
const js = (await bundle("src/main.js"))
  .replace(/<\/script/gi, "<\\/script")
  .replace(/<(!--|script)/gi, "\\x3C$1");
for (const s of ["</script", "<!--", "<script"]) {
  if (js.toLowerCase().includes(s)) throw new Error(`the script still holds ${s}`);
}
const css = await bundle("src/style.css");
const sha = (text) => createHash("sha256").update(text, "utf8").digest("base64");
const csp = [
  "default-src 'none'",
  `script-src 'sha256-${sha(js)}'`,
  "style-src 'unsafe-inline'",
  "connect-src 'self'",
  "img-src data:",
  "font-src data:",
  "base-uri 'none'",
  "form-action 'none'",
].join("; ");
// What the asset was built from; coil-server's tests recompute it, so a
// source changed without a rebuild fails there.
const sources = ["build.mjs", "package.json", "package-lock.json"]
  .concat(readdirSync(new URL("src", import.meta.url)).sort().map((f) => `src/${f}`));
const fingerprint = createHash("sha256");
for (const f of sources) {
  fingerprint.update(`${f}\0`);
  fingerprint.update(readFileSync(new URL(f, import.meta.url)));
  fingerprint.update("\0");
}
const licenses =
  "coil chat page. Bundled: markdown-it (MIT), highlight.js (BSD-3-Clause), Temml (MIT); see web/package.json";
let html = readFileSync(new URL("src/index.html", import.meta.url), "utf8");
const fill = (key, value) => {
  if (!html.includes(key)) throw new Error(`src/index.html has no ${key}`);
  html = html.replace(key, () => value);
};
fill("{{CSP}}", csp);
fill("{{LICENSES}}", licenses);
fill("{{SOURCES}}", `sources sha256:${fingerprint.digest("hex")}`);
fill("{{STYLE}}", css);
fill("{{SCRIPT}}", js);
writeFileSync(out, html);
const raw = Buffer.byteLength(html);
const gz = gzipSync(html, { level: 9 }).length;
console.log(
  `wrote ${out.pathname}: ${(raw / 1024).toFixed(1)} KiB, ${(gz / 1024).toFixed(1)} KiB gzip`,
);
