// Kernel network events, aggregated in the kernel.
//
// tcp:tcp_retransmit_skb -> retransmissions per peer prefix (the destination
// address masked to a configured length), never per 5-tuple.
// skb:kfree_skb -> dropped packets per drop reason (the reason enum differs
// between kernels; the agent reads its names from tracefs).
//
// Only tracepoint arguments are read, at offsets the agent takes from the
// tracepoints' tracefs format files and passes as cflags, so no kernel
// struct layout is compiled in. Note: tracepoints are per kernel, not per
// network namespace.

#include <uapi/linux/bpf.h>

#ifndef HZ_PREFIX_V4
#define HZ_PREFIX_V4 24
#endif
#ifndef HZ_PREFIX_V6
#define HZ_PREFIX_V6 64
#endif
#ifndef HZ_MAX_PREFIXES
#define HZ_MAX_PREFIXES 1024
#endif

struct hz_prefix {
    u16 family;  // AF_INET (2) or AF_INET6 (10)
    u16 length;
    u8 addr[16];
};

BPF_TABLE("lru_percpu_hash", struct hz_prefix, u64, hz_retransmits, HZ_MAX_PREFIXES);
BPF_PERCPU_HASH(hz_drops, u32, u64, 512);

static __always_inline void hz_mask(u8 *addr, u32 bits, u32 len) {
#pragma unroll
    for (u32 i = 0; i < 16; i++) {
        if (i >= len)
            break;
        if (bits >= (i + 1) * 8)
            continue;
        u32 keep = bits > i * 8 ? bits - i * 8 : 0;
        addr[i] &= (u8)(0xff << (8 - keep));
    }
}

#ifdef HZ_RETX_FAMILY_OFF
int hz_tcp_retransmit(void *ctx) {
    struct hz_prefix key = {};
    key.family = *(u16 *)((char *)ctx + HZ_RETX_FAMILY_OFF);
    if (key.family == 2) {
        bpf_probe_read_kernel(key.addr, 4, (char *)ctx + HZ_RETX_DADDR_OFF);
        key.length = HZ_PREFIX_V4;
        hz_mask(key.addr, HZ_PREFIX_V4, 4);
    } else if (key.family == 10) {
        bpf_probe_read_kernel(key.addr, 16, (char *)ctx + HZ_RETX_DADDR6_OFF);
        key.length = HZ_PREFIX_V6;
        hz_mask(key.addr, HZ_PREFIX_V6, 16);
    } else {
        return 0;
    }
    u64 zero = 0;
    u64 *v = hz_retransmits.lookup_or_try_init(&key, &zero);
    if (v)
        *v += 1;
    return 0;
}
#endif

#ifdef HZ_KFREE_REASON_OFF
int hz_kfree_skb(void *ctx) {
    u32 reason = *(u32 *)((char *)ctx + HZ_KFREE_REASON_OFF);
    // 0 and 1 mean "not dropped" / "consumed" on kernels that pass them here.
    if (reason <= 1)
        return 0;
    u64 zero = 0;
    u64 *v = hz_drops.lookup_or_try_init(&reason, &zero);
    if (v)
        *v += 1;
    return 0;
}
#endif
