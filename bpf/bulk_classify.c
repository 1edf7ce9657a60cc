// Puts jobs' declared bulk traffic into the agent's HTB classes.
//
// Attached with cls_bpf in direct-action mode at clsact egress (ffff:fff3) of
// a data link whose root qdisc is the agent's HTB. The clsact egress hook runs
// in __dev_queue_xmit before the packet is enqueued to the root qdisc, and
// HTB's classify first takes skb->priority as a class id when it names one
// of its own leaf classes; so setting skb->priority here is all it takes, with
// no filter on the HTB. Packets that match no job keep their priority and
// fall into HTB's default class, where the collectives are.
//
// Bulk is recognised by DSCP (IPv4 TOS / IPv6 traffic class) or by the remote
// TCP port (on egress, the destination port), together with the user the
// kernel says owns the packet's socket: a job's declaration only classifies
// packets of its own users' sockets (the users of the job's Unix group), so a
// tenant naming another tenant's port or DSCP value captures none of its
// traffic. A packet with no local socket (forwarded) matches no job. Returns
// TC_ACT_UNSPEC: it never changes a verdict, and later filters still run.
//
// Built against UAPI headers only. Parameters through maps the agent fills:
// per interface its header length; (socket uid, port or DSCP) -> class id.

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>

// Interfaces are found by ifindex modulo this, as in link_counters.c.
#define HZ_IF_TABLE 4096

struct hz_bulk_if {
    u32 ifindex;  // 0: not ours
    u32 l2_len;   // bytes before the IP header: 14 on Ethernet, 0 on raw IP links
};

// A flow's key: the socket's owner, and a TCP port or HZ_DSCP | a DSCP value.
#define HZ_DSCP 0x10000
struct hz_bulk_flow {
    u32 uid;
    u32 what;
};

BPF_ARRAY(hz_bulk_ifs, struct hz_bulk_if, HZ_IF_TABLE);
BPF_HASH(hz_bulk_flows, struct hz_bulk_flow, u32, 65536);
// Packets put into a bulk class, for operators and tests.
BPF_PERCPU_ARRAY(hz_bulk_marked, u64, 1);

static __always_inline int hz_mark(struct __sk_buff *skb, u32 classid) {
    if (classid == 0)
        return 0;
    skb->priority = classid;
    u32 zero = 0;
    u64 *marked = hz_bulk_marked.lookup(&zero);
    if (marked)
        *marked += skb->gso_segs ? skb->gso_segs : 1;
    return 1;
}

int hz_bulk_egress(struct __sk_buff *skb) {
    u32 key = skb->ifindex % HZ_IF_TABLE;
    struct hz_bulk_if *iface = hz_bulk_ifs.lookup(&key);
    if (!iface || iface->ifindex != skb->ifindex)
        return TC_ACT_UNSPEC;
    u32 l2 = iface->l2_len > 64 ? 0 : iface->l2_len;
    u8 hdr[10] = {0};
    u32 dscp, proto, l4;
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        // version/IHL, TOS, length, id, flags/fragment offset, TTL, protocol
        if (bpf_skb_load_bytes(skb, l2, hdr, 10) != 0)
            return TC_ACT_UNSPEC;
        dscp = hdr[1] >> 2;
        // Only the first fragment carries the TCP header.
        proto = ((hdr[6] & 0x1f) | hdr[7]) == 0 ? hdr[9] : 0;
        l4 = l2 + (hdr[0] & 0x0f) * 4;
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        if (bpf_skb_load_bytes(skb, l2, hdr, 8) != 0)
            return TC_ACT_UNSPEC;
        dscp = (((hdr[0] & 0x0f) << 4) | (hdr[1] >> 4)) >> 2;
        proto = hdr[6];  // extension headers are not followed
        l4 = l2 + 40;
    } else {
        return TC_ACT_UNSPEC;
    }
    // The kernel's owner of the socket (the overflow uid when there is none).
    struct hz_bulk_flow flow = {.uid = bpf_get_socket_uid(skb), .what = HZ_DSCP | dscp};
    u32 *by_dscp = hz_bulk_flows.lookup(&flow);
    if (by_dscp && hz_mark(skb, *by_dscp))
        return TC_ACT_UNSPEC;
    if (proto != 6)
        return TC_ACT_UNSPEC;
    u8 ports[4];
    if (bpf_skb_load_bytes(skb, l4, ports, 4) != 0)
        return TC_ACT_UNSPEC;
    flow.what = ((u32)ports[2] << 8) | ports[3];
    u32 *by_port = hz_bulk_flows.lookup(&flow);
    if (by_port)
        hz_mark(skb, *by_port);
    return TC_ACT_UNSPEC;
}
