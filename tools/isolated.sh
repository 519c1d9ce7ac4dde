#!/usr/bin/env bash
# Run a command in a loopback-only network namespace when this user can make one,
# so no test reaches, or is reachable from, anything but 127.0.0.1 (Mooncake's
# listeners bind every interface; inside the namespace only lo exists). Where
# namespaces are unavailable (not root, no unshare), run it directly with a note.
set -euo pipefail
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null \
   && unshare -n true 2>/dev/null; then
  exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$@"
fi
echo "note: no network namespace available; running in the host network (tests bind 127.0.0.1)" >&2
exec "$@"
