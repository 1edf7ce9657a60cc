// Test-only: drops a set share of packets on the interface it is attached to,
// so tests see real drops and TCP retransmissions (this kernel has no netem).
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

BPF_ARRAY(test_drop_permille, u32, 1);

int test_drop(struct __sk_buff *skb) {
    u32 key = 0;
    u32 *permille = test_drop_permille.lookup(&key);
    if (permille && bpf_get_prandom_u32() % 1000 < *permille)
        return TC_ACT_SHOT;
    return TC_ACT_OK;
}
