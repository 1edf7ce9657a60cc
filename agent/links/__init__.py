"""The links domain: types, the observer (eBPF datapath or /proc), the sans-I/O health
engine, and the readers it needs (sysfs/procfs, tracefs formats, netlink, tc)."""
