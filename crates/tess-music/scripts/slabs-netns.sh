#!/usr/bin/env bash
# Gives the SLABS emulator a "second host" and a cable to it, the same layout as
# tess_music::netns::NetnsPair: network namespace NAME (the device: NAME-e, 10.213.78.2/30), a
# wire namespace NAME-w that forwards (NAME-f 10.213.78.1/30 towards the device, NAME-d
# 10.213.77.2/30 towards the host), and the root namespace (NAME-h, 10.213.77.1/30: the
# synthesizer binds here).
#
#   slabs-netns.sh up   [NAME] [HARTS]   create (removing a stale one first); with HARTS (a
#                                        hex mask, e.g. 2 for hart 1) the wire runs there (RPS)
#   slabs-netns.sh pace [NAME]           the cable releases one SLABS packet per 45.35 us
#                                        (tbf), for tess-slabs --pace link
#   slabs-netns.sh down [NAME]           remove
#
# Then: tess-migrator --bind 10.213.77.1:9701 ...
#       tess-slabs --netns NAME --to 10.213.77.1:9701 [--pace link --tap NAME-w:NAME-d] ...
# If `up` fails (no CAP_NET_ADMIN), run both on loopback: 127.0.0.1:9701.
set -euo pipefail
cmd=${1:-}
name=${2:-tess-slabs}
harts=${3:-}
host=${SLABS_PREFIX:-10.213.77}
dev=${SLABS_DEVICE_PREFIX:-10.213.78}
if [ ${#name} -gt 13 ]; then
  echo "slabs-netns: name '$name' longer than 13 characters (interface names are NAME-h/-d/-f/-e)" >&2
  exit 2
fi
down() {
  ip link del "$name-h" 2>/dev/null || true
  ip netns del "$name-w" 2>/dev/null || true
  ip netns del "$name" 2>/dev/null || true
}
case "$cmd" in
  up)
    down
    ip netns add "$name"
    ip netns add "$name-w"
    ip link add "$name-h" type veth peer name "$name-d" netns "$name-w"
    ip addr add "$host.1/30" dev "$name-h"
    ip link set "$name-h" up
    ip -n "$name-w" addr add "$host.2/30" dev "$name-d"
    ip -n "$name-w" link set "$name-d" up
    ip -n "$name-w" link add "$name-f" type veth peer name "$name-e" netns "$name"
    ip -n "$name-w" addr add "$dev.1/30" dev "$name-f"
    ip -n "$name-w" link set "$name-f" up
    ip -n "$name-w" link set lo up
    ip -n "$name" addr add "$dev.2/30" dev "$name-e"
    ip -n "$name" link set "$name-e" up
    ip -n "$name" link set lo up
    ip -n "$name" route add default via "$dev.1"
    ip route add "$dev.0/30" via "$host.2" dev "$name-h"
    ip netns exec "$name-w" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
    if [ -n "$harts" ]; then
      ip netns exec "$name-w" sh -c "echo $harts > /sys/class/net/$name-f/queues/rx-0/rps_cpus"
    fi
    echo "host (synthesizer): $host.1 on $name-h; device (emulator, netns $name): $dev.2 on $name-e; wire: netns $name-w"
    ;;
  pace)
    # 834 bytes on the wire per input packet, one per 2/44100 s; a burst of 3 packets.
    tc -n "$name-w" qdisc replace dev "$name-d" root tbf rate 18389700bps burst 2502 limit 524288
    ;;
  down)
    down
    ;;
  *)
    echo "usage: $0 up [NAME] [HARTS] | pace [NAME] | down [NAME]" >&2
    exit 2
    ;;
esac
