#!/usr/bin/env bash
# Type-check gyre/, sim/, real/runtime/, real/proxy/ and real/store/ under the names they import as.
# sim/, real/ and analysis/ import as gyre.sim, gyre.real, gyre.analysis
# (setuptools' package-dir mapping), which mypy cannot see; so it checks a tree
# of links, VENV/typecheck/gyre, that lays the rooms out as they import.
# Settings: [tool.mypy] in pyproject.toml. Usage: tools/typecheck.sh [VENV]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(cd "${1:-$root/.venv}" && pwd)"
view="$venv/typecheck"
rm -rf "$view" && mkdir -p "$view/gyre"
for entry in "$root"/gyre/*; do ln -s "$entry" "$view/gyre/"; done
for room in sim real analysis paper_figs; do ln -s "$root/$room" "$view/gyre/$room"; done
cd "$view"
exec "$venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$venv/.mypy_cache" \
  gyre/*.py gyre/formats gyre/trajectory gyre/sim gyre/real/runtime gyre/real/proxy gyre/real/store
