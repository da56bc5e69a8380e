#!/bin/sh
# The ramdisk's udhcpc event script (busybox ships none). udhcpc runs it with $1 the event and
# the lease in the environment: $interface $ip $mask $router $dns $hostname.
case "$1" in
  deconfig)
    ip addr flush dev "$interface"
    ip link set "$interface" up
    ;;
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    if [ -n "$router" ]; then
      ip route replace default via "${router%% *}" dev "$interface"
    fi
    : > /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
    if [ -n "$hostname" ]; then hostname "$hostname"; fi
    echo "udhcpc.sh: $interface $ip/${mask:-24} via ${router:-none} dns ${dns:-none}"
    ;;
esac
exit 0
