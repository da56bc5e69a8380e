#!/bin/sh
# Runs inside the test VM (busybox sh): prints the part of /sys that bcd's inventory probes read
# for PCI functions, NUMA nodes, block devices and NICs, one entry a line:
#   D <path>            a directory
#   F <path> <base64>   a regular file and its content
#   L <path> <target>   a symbolic link, its target as written (relative)
# tests/e2e/src/vm.rs (`write_sys_tree`) recreates the tree from these lines, under a fixture
# directory (BC_VM_CAPTURE). Unreadable files (write-only, or an error on read) are left out.
f() { [ -f "$1" ] && c=$(base64 -w 0 < "$1" 2>/dev/null) && echo "F $1 $c"; }
l() { [ -L "$1" ] && echo "L $1 $(readlink "$1")"; }
dev() { # a device directory: its files of interest and its links
  d=$1; shift
  echo "D $d"
  for x in "$@"; do f "$d/$x"; done
  for x in driver device subsystem; do l "$d/$x"; done
}
for p in /sys/bus/pci/devices/*; do
  l "$p"
  r=$(readlink -f "$p")
  dev "$r" vendor device class numa_node revision subsystem_vendor subsystem_device \
    current_link_speed current_link_width max_link_speed max_link_width sriov_totalvfs sriov_numvfs
done
for n in /sys/devices/system/node/node*; do dev "$n" cpulist meminfo; done
f /sys/devices/system/node/online
for b in /sys/block/*; do
  l "$b"
  r=$(readlink -f "$b")
  dev "$r" size removable hidden serial wwid ro queue/logical_block_size \
    queue/physical_block_size queue/rotational
  d=$(readlink -f "$r/device")
  [ -n "$d" ] && dev "$d" serial model vendor rev wwid vpd_pg80 vpd_pg83 firmware_rev \
    transport
  for s in "$r"/*/partition; do [ -f "$s" ] && f "$s"; done
done
for c in /sys/class/nvme/*; do l "$c"; r=$(readlink -f "$c"); dev "$r" serial model firmware_rev transport; done
for n in /sys/class/net/*; do
  l "$n"
  r=$(readlink -f "$n")
  dev "$r" address mtu carrier speed duplex operstate type addr_assign_type
done
