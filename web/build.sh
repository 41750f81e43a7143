#!/usr/bin/env bash
# Builds the chat page `coil serve` shows at / into one self-contained HTML
# file, crates/coil-server/assets/chat.html (committed: `cargo build` needs
# no Node). Needs Node 18+ and npm; installs the locked packages first.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  npm ci --ignore-scripts --no-audit --no-fund
fi
node build.mjs
