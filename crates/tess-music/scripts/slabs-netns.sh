#!/usr/bin/env bash
# Gives the SLABS emulator a "second host": network namespace NAME joined to the root namespace
# by a veth pair, NAME-h (10.213.77.1/30, root namespace, the synthesizer binds here) and NAME-d
# (10.213.77.2/30, inside NAME, the emulator). Same layout as tess_music::netns::NetnsPair.
#
#   slabs-netns.sh up   [NAME]   create (removing a stale one first); prints the addresses
#   slabs-netns.sh down [NAME]   remove
#
# Then: tess-migrator --bind 10.213.77.1:9701 ...
#       tess-slabs --netns NAME --to 10.213.77.1:9701 ...   (or: ip netns exec NAME tess-slabs ...)
# If `up` fails (no CAP_NET_ADMIN), run both on loopback: 127.0.0.1:9701.
set -euo pipefail
cmd=${1:-}
name=${2:-tess-slabs}
prefix=${SLABS_PREFIX:-10.213.77}
if [ ${#name} -gt 13 ]; then
  echo "slabs-netns: name '$name' longer than 13 characters (interface names are NAME-h/NAME-d)" >&2
  exit 2
fi
down() {
  ip link del "$name-h" 2>/dev/null || true
  ip netns del "$name" 2>/dev/null || true
}
case "$cmd" in
  up)
    down
    ip netns add "$name"
    ip link add "$name-h" type veth peer name "$name-d" netns "$name"
    ip addr add "$prefix.1/30" dev "$name-h"
    ip link set "$name-h" up
    ip -n "$name" addr add "$prefix.2/30" dev "$name-d"
    ip -n "$name" link set "$name-d" up
    ip -n "$name" link set lo up
    echo "host (synthesizer): $prefix.1 on $name-h; device (emulator, netns $name): $prefix.2 on $name-d"
    ;;
  down)
    down
    ;;
  *)
    echo "usage: $0 up|down [NAME]" >&2
    exit 2
    ;;
esac
