// In-pod traffic capture without netfilter: tc programs that hand a pod's TCP connections to
// ztunnel's in-pod listeners (outbound 15001, inbound plaintext 15006), the eBPF twin of
// istio-cni's REDIRECT rules. The loader and the design notes are in ebpf/src/lib.rs.
//
// - mesh_capture_in  (clsact ingress, pod interfaces): a TCP packet to the pod that no socket of the
//   netns owns yet (dport != 15008, source != 169.254.7.127, not marked by ztunnel) is assigned
//   to the listener on :15006.
// - mesh_capture_out (clsact egress, pod interfaces): a new TCP connection from an unmarked socket,
//   and every later packet of a connection ztunnel accepted that way, is marked CAPTURE_MARK
//   and redirected into lo's ingress (policy routing delivers mark CAPTURE_MARK locally).
// - mesh_capture_lo  (clsact ingress, lo): such a packet, when no socket owns it yet, is assigned to
//   the listener on :15001. The accepted socket's local address is the original destination.
//
// No maps, no BTF needed: compiled with `clang -O2 -target bpf` from the uapi headers only.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>

#define SEC(name) __attribute__((section(name), used))
#define INLINE static inline __attribute__((always_inline))

static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) =
	(void *)BPF_FUNC_skb_pull_data;
static struct bpf_sock *(*bpf_skc_lookup_tcp)(void *ctx, struct bpf_sock_tuple *tuple,
					       __u32 tuple_size, __u64 netns, __u64 flags) =
	(void *)BPF_FUNC_skc_lookup_tcp;
static long (*bpf_sk_release)(void *sk) = (void *)BPF_FUNC_sk_release;
static long (*bpf_sk_assign)(void *ctx, void *sk, __u64 flags) = (void *)BPF_FUNC_sk_assign;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BE16(x) ((__be16)__builtin_bswap16(x))
#define BE32(x) ((__be32)__builtin_bswap32(x))
#else
#define BE16(x) ((__be16)(x))
#define BE32(x) ((__be32)(x))
#endif

// Ports, marks and the probe address: written by build.rs from the mesh-capture crate.
#include "capture_contract.h"
#define LOOPBACK_IFINDEX 1

struct packet {
	struct bpf_sock_tuple tuple; // ipv4: saddr, daddr, sport, dport (network order)
	int syn;		     // SYN without ACK: a new connection
};

// Parses Ethernet + IPv4 + TCP. Returns 0 for a TCP packet (first fragment or unfragmented).
INLINE int parse(struct __sk_buff *skb, struct packet *pkt)
{
	if (skb->protocol != BE16(ETH_P_IP))
		return -1;
	__u32 want = sizeof(struct ethhdr) + 60 + sizeof(struct tcphdr);
	if (want > skb->len)
		want = skb->len;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + want > end) {
		bpf_skb_pull_data(skb, want);
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
	}
	struct iphdr *ip = data + sizeof(struct ethhdr);
	if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_TCP)
		return -1;
	if (ip->frag_off & BE16(0x1fff))
		return -1;
	__u32 ihl = (ip->ihl & 0xf) * 4;
	if (ihl < sizeof(struct iphdr))
		return -1;
	struct tcphdr *tcp = (void *)ip + ihl;
	if ((void *)(tcp + 1) > end)
		return -1;
	pkt->tuple.ipv4.saddr = ip->saddr;
	pkt->tuple.ipv4.daddr = ip->daddr;
	pkt->tuple.ipv4.sport = tcp->source;
	pkt->tuple.ipv4.dport = tcp->dest;
	pkt->syn = tcp->syn && !tcp->ack;
	return 0;
}

INLINE int is_loopback(__be32 addr)
{
	return (addr & BE32(0xff000000)) == BE32(0x7f000000);
}

// Whether a socket of this netns (other than a listener) already owns the packet's
// connection. A TIME_WAIT socket does not own a new SYN: the connection is new.
INLINE int owned(struct __sk_buff *skb, struct packet *pkt)
{
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &pkt->tuple, sizeof(pkt->tuple.ipv4),
						 BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	__u32 state = sk->state;
	bpf_sk_release(sk);
	if (state == BPF_TCP_LISTEN)
		return 0;
	if (state == BPF_TCP_TIME_WAIT && pkt->syn)
		return 0;
	return 1;
}

// Hands the packet to the listener on `port` (any address of the netns, e.g. 0.0.0.0).
// Without a listener the packet is dropped: capture fails closed, and the peer's SYN
// retransmissions succeed once ztunnel listens.
INLINE int to_listener(struct __sk_buff *skb, struct packet *pkt, __u16 port)
{
	struct bpf_sock_tuple tuple = pkt->tuple;
	tuple.ipv4.dport = BE16(port);
	struct bpf_sock *sk =
		bpf_skc_lookup_tcp(skb, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return TC_ACT_SHOT;
	long err = -1;
	if (sk->state == BPF_TCP_LISTEN)
		err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	return err == 0 ? TC_ACT_OK : TC_ACT_SHOT;
}

SEC("classifier/mesh_capture_in")
int mesh_capture_in(struct __sk_buff *skb)
{
	struct packet pkt = {};
	if (parse(skb, &pkt))
		return TC_ACT_OK;
	if (pkt.tuple.ipv4.dport == BE16(HBONE_PORT) ||
	    pkt.tuple.ipv4.saddr == BE32(PROBE_SNAT_IP) || is_loopback(pkt.tuple.ipv4.daddr) ||
	    (skb->mark & MARK_MASK) == PROXY_MARK)
		return TC_ACT_OK;
	if (owned(skb, &pkt))
		return TC_ACT_OK;
	return to_listener(skb, &pkt, INBOUND_CAPTURE_PORT);
}

SEC("classifier/mesh_capture_out")
int mesh_capture_out(struct __sk_buff *skb)
{
	if ((skb->mark & MARK_MASK) == PROXY_MARK)
		return TC_ACT_OK;
	struct packet pkt = {};
	if (parse(skb, &pkt))
		return TC_ACT_OK;
	if (pkt.tuple.ipv4.daddr == BE32(PROBE_SNAT_IP) || is_loopback(pkt.tuple.ipv4.daddr))
		return TC_ACT_OK;
	// Looked up as if received: a socket whose local address is the destination is the
	// ztunnel side of a connection captured earlier.
	if (!owned(skb, &pkt) && !pkt.syn)
		return TC_ACT_OK;
	// lo's address is 00:00:00:00:00:00; any other destination MAC makes the packet
	// PACKET_OTHERHOST there, which IP drops.
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	__builtin_memset(eth->h_dest, 0, ETH_ALEN);
	skb->mark = (skb->mark & ~MARK_MASK) | CAPTURE_MARK;
	return bpf_redirect(LOOPBACK_IFINDEX, BPF_F_INGRESS);
}

SEC("classifier/mesh_capture_lo")
int mesh_capture_lo(struct __sk_buff *skb)
{
	if ((skb->mark & MARK_MASK) != CAPTURE_MARK)
		return TC_ACT_OK;
	struct packet pkt = {};
	if (parse(skb, &pkt))
		return TC_ACT_OK;
	if (owned(skb, &pkt))
		return TC_ACT_OK;
	return to_listener(skb, &pkt, OUTBOUND_CAPTURE_PORT);
}

char LICENSE[] SEC("license") = "Apache-2.0";
