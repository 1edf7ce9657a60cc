// tc clsact counters per interface, direction and traffic class.
//
// Attached with cls_bpf in direct-action mode at ingress (ffff:fff2) and
// egress (ffff:fff3) of every watched interface. Counts packets from
// gso_segs (a GSO/GRO super-packet counts as the segments it carries) and
// bytes from skb->len, plus the headers each further segment repeats on the
// wire (segmentation happens after this hook on egress and GRO merged them
// before it on ingress), so bytes match what the NIC puts on the link. Also
// counts ECN-capable and CE-marked packets. Everything goes into a per-CPU
// array: no atomics, no shared cache lines on the packet path. Never
// changes a packet or its verdict: it returns TC_ACT_UNSPEC, so the next
// filter on the hook (Cilium's, an operator's) still runs; TC_ACT_OK would
// end classification in direct-action mode.
//
// Built against UAPI headers only. Parameters reach it through a map filled
// by the agent: per watched interface its counter slot, its header length
// and how DSCP values map to the eight classes. Limits come as cflags.

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>

#ifndef HZ_MAX_SLOTS
#define HZ_MAX_SLOTS 32
#endif
// Interfaces are found by ifindex modulo this (an array lookup is inlined by
// the verifier; a hash lookup is not). The agent refuses two watched
// interfaces that collide.
#define HZ_IF_TABLE 4096
#define HZ_CLASSES 8
#define HZ_DIRS 2

enum { HZ_BYTES = 0, HZ_PACKETS = 1, HZ_ECT = 2, HZ_CE = 3, HZ_FIELDS = 4 };

struct hz_if {
    u32 ifindex;     // 0: not watched
    u32 slot;        // index into hz_link_counters
    u32 l2_len;      // bytes before the IP header: 14 on Ethernet, 0 on raw IP links
    u8 dscp_class[64];
};

struct hz_counters {
    u64 v[HZ_DIRS][HZ_CLASSES][HZ_FIELDS];
};

BPF_PERCPU_ARRAY(hz_link_counters, struct hz_counters, HZ_MAX_SLOTS);
BPF_ARRAY(hz_if_table, struct hz_if, HZ_IF_TABLE);

// Reads two bytes at `off`, directly where the packet data is linear (the
// common case), else through the helper.
static __always_inline int hz_load2(struct __sk_buff *skb, u32 off, u8 *out) {
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (off > 256)
        return -1;
    u8 *p = data + off;
    if ((void *)(p + 2) <= end) {
        out[0] = p[0];
        out[1] = p[1];
        return 0;
    }
    return bpf_skb_load_bytes(skb, off, out, 2);
}

// Bytes of L2+L3+L4 headers, which every segment of a GSO packet repeats.
// Only called for GSO packets (segs > 1), so the loads are amortised.
static __always_inline u32 hz_header_len(struct __sk_buff *skb, u32 l2_len, int v6) {
    u8 b[2] = {0, 0};
    u32 l3_len, proto;
    if (!v6) {
        if (hz_load2(skb, l2_len, b) != 0)
            return 0;
        l3_len = (b[0] & 0x0f) * 4;
        if (hz_load2(skb, l2_len + 8, b) != 0)  // ttl, protocol
            return 0;
        proto = b[1];
    } else {
        l3_len = 40;  // extension headers are rare on GSO traffic; not followed
        if (hz_load2(skb, l2_len + 6, b) != 0)  // next header, hop limit
            return 0;
        proto = b[0];
    }
    if (proto == 6) {  // TCP: data offset in 32-bit words
        if (hz_load2(skb, l2_len + l3_len + 12, b) != 0)
            return 0;
        return l2_len + l3_len + (b[0] >> 4) * 4;
    }
    if (proto == 17)  // UDP
        return l2_len + l3_len + 8;
    return 0;
}

static __always_inline int hz_count(struct __sk_buff *skb, u32 dir) {
    u32 key = skb->ifindex % HZ_IF_TABLE;
    struct hz_if *iface = hz_if_table.lookup(&key);
    if (!iface || iface->ifindex != skb->ifindex)
        return TC_ACT_UNSPEC;
    u32 l2_len = iface->l2_len > 64 ? 0 : iface->l2_len;
    u8 hdr[2] = {0, 0};
    u8 tos = 0;
    int v6 = 0;
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        if (hz_load2(skb, l2_len, hdr) == 0)
            tos = hdr[1];
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        v6 = 1;
        // The traffic class straddles the first two bytes of the IPv6 header.
        if (hz_load2(skb, l2_len, hdr) == 0)
            tos = ((hdr[0] & 0x0f) << 4) | (hdr[1] >> 4);
    }
    u32 cls = iface->dscp_class[(tos >> 2) & 63] & (HZ_CLASSES - 1);
    u32 slot = iface->slot;
    struct hz_counters *c = hz_link_counters.lookup(&slot);
    if (!c)
        return TC_ACT_UNSPEC;
    u64 segs = skb->gso_segs ? skb->gso_segs : 1;
    u64 bytes = skb->len;
    if (segs > 1)
        bytes += (segs - 1) * hz_header_len(skb, l2_len, v6);
    u64 *v = c->v[dir & 1][cls];
    v[HZ_BYTES] += bytes;
    v[HZ_PACKETS] += segs;
    if (tos & 3) {
        v[HZ_ECT] += segs;
        if ((tos & 3) == 3)
            v[HZ_CE] += segs;
    }
    return TC_ACT_UNSPEC;
}

int hz_tc_ingress(struct __sk_buff *skb) { return hz_count(skb, 0); }
int hz_tc_egress(struct __sk_buff *skb) { return hz_count(skb, 1); }
