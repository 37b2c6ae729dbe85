// The in-pod legs of a mesh connection, socket to socket: sockmap programs that move bytes
// between an application's socket and ztunnel's socket of the same connection inside one pod
// without the local TCP stack. The loader and the design notes are in ebpf/src/sockmap.rs.
//
// - mesh_sockops (sock_ops, on a cgroup v2): when an IPv4 TCP connection is established, a
//   socket of an enrolled pod is added to one of two sock hashes: ztunnel's own sockets (the
//   mark PROXY_MARK) to mesh_proxy_socks, every other socket to mesh_app_socks. Both are keyed
//   by the connection as the application sees it (netns cookie, app address, peer address), so
//   the two ends of one local TCP connection (whose 4-tuples mirror each other) share a key.
// - mesh_sk_msg (sk_msg, on both sock hashes): a send is queued straight into the other end's
//   receive queue when that end is in the other hash. A socket whose first send finds no
//   partner sends over TCP for its whole life, so a stream never mixes both paths while its
//   partner lives (once the partner closed, sends go to TCP, which reports the close).
//
// Compiled with `clang -O2 -g -target bpf` from the uapi headers only; maps are BTF-defined.

#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define INLINE static inline __attribute__((always_inline))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_sock_hash_update)(struct bpf_sock_ops *skops, void *map, void *key,
				    __u64 flags) = (void *)BPF_FUNC_sock_hash_update;
static long (*bpf_msg_redirect_hash)(struct sk_msg_md *msg, void *map, void *key, __u64 flags) =
	(void *)BPF_FUNC_msg_redirect_hash;
static void *(*bpf_sk_storage_get)(void *map, void *sk, void *value, __u64 flags) =
	(void *)BPF_FUNC_sk_storage_get;
static __u64 (*bpf_get_netns_cookie)(void *ctx) = (void *)BPF_FUNC_get_netns_cookie;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NTOHL(x) __builtin_bswap32(x)
#else
#define NTOHL(x) (x)
#endif

// remote_port of sock_ops and sk_msg contexts: the port in network order, as a 32-bit
// big-endian number (the kernel shifts it into the high half on little-endian CPUs).
#define REMOTE_PORT(ctx) ((__u32)NTOHL(CTX_READ((ctx)->remote_port)))

// One load per context field, before any branch: the verifier refuses a context access whose
// offset the compiler picked with a conditional.
#define CTX_READ(field) (*(volatile __u32 *)&(field))

// Ports and marks: written by build.rs from the mesh-capture crate.
#include "capture_contract.h"

#define AF_INET 2

// One local TCP connection, as its application end sees it. Ports in host order.
struct pair_key {
	__u64 netns;
	__u32 app_ip;  // network order
	__u32 peer_ip; // network order
	__u32 app_port;
	__u32 peer_port;
};

enum role { ROLE_APP = 1, ROLE_PROXY = 2 };

// What a socket in a hash does with its sends; it lives as long as the socket.
struct sock_state {
	__u32 role;
	// 0: no send yet; SEND_REDIRECT: its first send found the partner; SEND_TCP: it did not.
	__u32 sends;
};

#define SEND_REDIRECT 1
#define SEND_TCP 2

// The counters user space reads (per CPU, summed by the loader).
enum stat {
	STAT_APP_SOCKETS,
	STAT_PROXY_SOCKETS,
	STAT_REDIRECTED_MSGS,
	STAT_REDIRECTED_BYTES,
	STAT_TCP_STREAMS,
	STAT_INSERT_FAILED,
	STAT_COUNT,
};

// IPv4 addresses (network order) of this node's enrolled pods, written by the node agent.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} mesh_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct pair_key);
	__type(value, __u32);
} mesh_app_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct pair_key);
	__type(value, __u32);
} mesh_proxy_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
} mesh_sock_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} mesh_sockmap_stats SEC(".maps");

INLINE void count(__u32 stat, __u64 by)
{
	__u64 *value = bpf_map_lookup_elem(&mesh_sockmap_stats, &stat);
	if (value)
		*value += by;
}

SEC("sockops")
int mesh_sockops(struct bpf_sock_ops *ops)
{
	if (ops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    ops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (ops->family != AF_INET)
		return 1;
	struct bpf_sock *sk = ops->sk;
	if (!sk)
		return 1;
	__u32 local_port = CTX_READ(ops->local_port);
	__u32 remote_port = REMOTE_PORT(ops);
	// ztunnel's tunnel connections are never an in-pod leg.
	if (local_port == HBONE_PORT || remote_port == HBONE_PORT)
		return 1;
	__u32 local_ip = CTX_READ(ops->local_ip4);
	__u32 remote_ip = CTX_READ(ops->remote_ip4);
	struct pair_key key = { .netns = bpf_get_netns_cookie(ops) };
	__u32 role;
	if ((sk->mark & MARK_MASK) == PROXY_MARK) {
		role = ROLE_PROXY;
		key.app_ip = remote_ip;
		key.app_port = remote_port;
		key.peer_ip = local_ip;
		key.peer_port = local_port;
	} else {
		role = ROLE_APP;
		key.app_ip = local_ip;
		key.app_port = local_port;
		key.peer_ip = remote_ip;
		key.peer_port = remote_port;
	}
	__u32 app_ip = key.app_ip;
	if (!bpf_map_lookup_elem(&mesh_pods, &app_ip))
		return 1;
	// The state first: a socket in a hash always has one, so its sends can record their path.
	struct sock_state *state =
		bpf_sk_storage_get(&mesh_sock_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!state) {
		count(STAT_INSERT_FAILED, 1);
		return 1;
	}
	state->role = role;
	state->sends = 0;
	void *hash = role == ROLE_PROXY ? (void *)&mesh_proxy_socks : (void *)&mesh_app_socks;
	// BPF_ANY: no other live socket of this netns has the same 4-tuple, so an entry under the
	// key is a stale one (a reset socket the app has not closed yet) and is replaced.
	if (bpf_sock_hash_update(ops, hash, &key, BPF_ANY) != 0) {
		// Full: this socket keeps the TCP path.
		state->sends = SEND_TCP;
		count(STAT_INSERT_FAILED, 1);
		return 1;
	}
	count(role == ROLE_PROXY ? STAT_PROXY_SOCKETS : STAT_APP_SOCKETS, 1);
	return 1;
}

SEC("sk_msg")
int mesh_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	if (!sk)
		return SK_PASS;
	struct sock_state *state = bpf_sk_storage_get(&mesh_sock_state, sk, 0, 0);
	if (!state || state->sends == SEND_TCP)
		return SK_PASS;
	struct pair_key key = { .netns = bpf_get_netns_cookie(msg) };
	void *partners;
	__u32 local_ip = CTX_READ(msg->local_ip4);
	__u32 remote_ip = CTX_READ(msg->remote_ip4);
	__u32 local_port = CTX_READ(msg->local_port);
	__u32 remote_port = REMOTE_PORT(msg);
	__u32 size = CTX_READ(msg->size);
	if (state->role == ROLE_PROXY) {
		partners = &mesh_app_socks;
		key.app_ip = remote_ip;
		key.app_port = remote_port;
		key.peer_ip = local_ip;
		key.peer_port = local_port;
	} else {
		partners = &mesh_proxy_socks;
		key.app_ip = local_ip;
		key.app_port = local_port;
		key.peer_ip = remote_ip;
		key.peer_port = remote_port;
	}
	if (bpf_msg_redirect_hash(msg, partners, &key, BPF_F_INGRESS) == SK_PASS) {
		state->sends = SEND_REDIRECT;
		count(STAT_REDIRECTED_MSGS, 1);
		count(STAT_REDIRECTED_BYTES, size);
		return SK_PASS;
	}
	// No partner. Before any redirect: this stream stays on TCP for good. After: the partner
	// closed, and TCP reports that to the sender as it would have without us.
	if (state->sends == 0) {
		state->sends = SEND_TCP;
		count(STAT_TCP_STREAMS, 1);
	}
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Apache-2.0";
