#!/usr/bin/env bash
# Builds the chat page `coil serve` shows at / into one self-contained HTML
# file, crates/coil-server/assets/chat.html (committed: `cargo build` needs
# no Node). Needs Node 18+ and npm; installs the locked packages first.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --ignore-scripts --no-audit --no-fund
fi
node build.mjs
