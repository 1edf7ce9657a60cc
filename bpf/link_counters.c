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
// Built against UAPI headers only. What only changes when the programs are
// loaded again is compiled in: the agent appends, per watched interface, a
// pair of programs hz_tc_i<slot> / hz_tc_e<slot> that call hz_count with the
// interface's counter slot and link-layer header length as constants, and
// passes the DSCP-to-class table as cflags (HZ_DSCP_W0..3). Looking these up
// in a map per packet (the interface by skb->ifindex, then its entry) touched
// two more cache lines per run, a third of the program's own cost on a busy
// host (./scripts/bench datapath-cost); a change of interfaces or classes
// restarts the observer, which loads the programs again.

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>

#ifndef HZ_MAX_SLOTS
#define HZ_MAX_SLOTS 32
#endif
#define HZ_CLASSES 8
#define HZ_DIRS 2
// DSCP d's class is in bits 4*(d%16) of word d/16; the default is the IP
// precedence, d >> 3.
#ifndef HZ_DSCP_W0
#define HZ_DSCP_W0 0x1111111100000000ULL
#define HZ_DSCP_W1 0x3333333322222222ULL
#define HZ_DSCP_W2 0x5555555544444444ULL
#define HZ_DSCP_W3 0x7777777766666666ULL
#endif

enum { HZ_BYTES = 0, HZ_PACKETS = 1, HZ_ECT = 2, HZ_CE = 3, HZ_FIELDS = 4 };

struct hz_counters {
    u64 v[HZ_DIRS][HZ_CLASSES][HZ_FIELDS];
};

BPF_PERCPU_ARRAY(hz_link_counters, struct hz_counters, HZ_MAX_SLOTS);

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

// Bytes of L2+L3+L4 headers, which every segment of a GSO packet repeats,
// through the helper (see hz_parse for the common case).
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

// TOS byte and, for a GSO packet, its header length, through the helper: for the
// rare packet whose headers are not all in its linear part.
static __always_inline u32 hz_parse_slow(struct __sk_buff *skb, u32 l2_len, int v6, int gso,
                                         u8 *tos) {
    u8 hdr[2] = {0, 0};
    if (hz_load2(skb, l2_len, hdr) == 0)
        *tos = v6 ? ((hdr[0] & 0x0f) << 4) | (hdr[1] >> 4) : hdr[1];
    return gso ? hz_header_len(skb, l2_len, v6) : 0;
}

// The same, read straight from the packet where its IP (and, for GSO, transport)
// header is in the linear part, which is nearly always: one bounds check per
// header instead of one per field.
static __always_inline u32 hz_parse(struct __sk_buff *skb, u32 l2_len, int v6, int gso,
                                    u8 *tos) {
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    u8 *ip = data + l2_len;
    u32 l3_len, proto;
    if (!v6) {
        if ((void *)(ip + 20) > end)
            return hz_parse_slow(skb, l2_len, v6, gso, tos);
        *tos = ip[1];
        if (!gso)
            return 0;
        l3_len = (ip[0] & 0x0f) * 4;
        proto = ip[9];
    } else {
        if ((void *)(ip + 40) > end)
            return hz_parse_slow(skb, l2_len, v6, gso, tos);
        // The traffic class straddles the first two bytes of the IPv6 header.
        *tos = ((ip[0] & 0x0f) << 4) | (ip[1] >> 4);
        if (!gso)
            return 0;
        l3_len = 40;  // extension headers are rare on GSO traffic; not followed
        proto = ip[6];
    }
    if (proto == 17)  // UDP
        return l2_len + l3_len + 8;
    if (proto != 6)
        return 0;
    u8 *tcp = ip + l3_len;
    if ((void *)(tcp + 13) > end)  // TCP's data offset, in 32-bit words
        return hz_parse_slow(skb, l2_len, v6, gso, tos);
    return l2_len + l3_len + (tcp[12] >> 4) * 4;
}

static __always_inline u32 hz_class(u32 dscp) {
    u64 word = dscp < 16 ? HZ_DSCP_W0 : dscp < 32 ? HZ_DSCP_W1 : dscp < 48 ? HZ_DSCP_W2
                                                                          : HZ_DSCP_W3;
    return (word >> ((dscp & 15) * 4)) & (HZ_CLASSES - 1);
}

// `slot` and `l2_len` are constants of the calling program (see the top).
static __always_inline int hz_count(struct __sk_buff *skb, u32 dir, u32 slot, u32 l2_len) {
    struct hz_counters *c = hz_link_counters.lookup(&slot);
    if (!c)
        return TC_ACT_UNSPEC;
    u64 segs = skb->gso_segs ? skb->gso_segs : 1;
    u64 bytes = skb->len;
    u8 tos = 0;
    u32 protocol = skb->protocol;
    if (protocol == bpf_htons(ETH_P_IP) || protocol == bpf_htons(ETH_P_IPV6)) {
        u32 hdr_len = hz_parse(skb, l2_len, protocol == bpf_htons(ETH_P_IPV6), segs > 1, &tos);
        bytes += (segs - 1) * hdr_len;
    }
    u64 *v = c->v[dir & 1][hz_class((tos >> 2) & 63)];
    v[HZ_BYTES] += bytes;
    v[HZ_PACKETS] += segs;
    if (tos & 3) {
        v[HZ_ECT] += segs;
        if ((tos & 3) == 3)
            v[HZ_CE] += segs;
    }
    return TC_ACT_UNSPEC;
}

// The programs, one pair per watched interface, follow (appended at load).
