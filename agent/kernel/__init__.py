"""The kernel-facing layer every domain may use: eBPF loading (in a helper process)
and map reads by syscall, tc and qdisc dumps, netlink on its own thread, sysfs and
procfs readers, tracefs formats. No domain logic lives here."""
