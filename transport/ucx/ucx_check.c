/*
 * ucx_check.c - a peer's UCX worker address and rkeys parsed in a forked
 * child before this process hands them to UCX.
 *
 * Why.  UCX 1.13 parses a packed worker address (ucp_ep_create) and a packed
 * rkey (ucp_ep_rkey_unpack) without a length, and asserts on what it does
 * not expect: one flipped bit in a worker address aborts the process 8 times
 * in 10 ("address.c:1051 Assertion `*addr_version == UCP_OBJECT_VERSION_V2'
 * failed").  The blob's checksum says only that the bytes are the ones the
 * sender framed; a registered but hostile or broken peer frames garbage just
 * as well, and the prefill node that connects to it must not die for it.
 *
 * How.  The bytes are copied into a buffer with KVR_UCX_PAD zero bytes after
 * them, so that a parse that runs past the end reads the same zeros in the
 * child and here.  A worker address (its format is UCX's, versioned and
 * interpreted against this worker's transports): a child (fork) runs the
 * very parse ucp_ep_create would run - ucp_address_unpack with the flags
 * ucp_ep_create passes, an internal function that libucp exports (UCX 1.11
 * to 1.16 keep its signature) - with its output to /dev/null, checks the
 * figures the lane selection will score (UCX 1.13's layout, below), and
 * exits 0 when all is well.  The parse only reads and allocates: nothing of the
 * child reaches the parent or a peer.  The parent waits at most
 * KVR_UCX_CHECK_MS (a pidfd poll); a child killed by a signal, exiting
 * non-zero or too slow means the blob is refused (KVR_ERR_CORRUPT) and the
 * caller fails the connect with that status.  Cost: a fork, ~1-5 ms, once
 * per connection.  KVR_UCX_CHECK=0 skips it.
 *
 * An rkey is checked here, in this process, for its structure (ucp_rkey.c:
 * MD map, memory type, one length-prefixed key per MD), which must end
 * inside the bytes received: ucp_ep_rkey_unpack cannot run in a child,
 * because on an endpoint still being wired up it may send, and the child's
 * message would reach the peer (seen as an assertion on an endpoint id).
 */
#include "ucx_internal.h"

#include "kvr_log.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <uct/api/uct.h>
#include <unistd.h>

#define COMP "ucx"

/* UCX's internal unpack (libucp exports it); the flags are
 * ucp_worker_default_address_pack_flags' (UUID | NAME | DEVICE_ADDR |
 * IFACE_ADDR | EP_ADDR; SYS_DEVICE is read from the address itself) and
 * NO_TRACE. */
struct uc_unpacked;
uint16_t ucs_crc16_string(const char *s); /* libucs: transport names are known by it */
ucs_status_t ucp_address_unpack(ucp_worker_h worker, const void *buffer, unsigned unpack_flags,
                                struct uc_unpacked *unpacked);
#define UNPACK_FLAGS 0x1001fu

/* UCX 1.13's ucp_unpacked_address_t and ucp_address_entry_t (wireup/address.h,
 * ucp_types.h: UCP_MAX_LANES 6, UCP_MAX_RESOURCES 128): the lane selection
 * after the parse scores each entry by its overhead, bandwidth and latency
 * and asserts that the score is not negative (select.c:294), so those must
 * be finite and not negative; and asks each transport whether the device
 * address is reachable, dereferencing it: only "self" may have none, and a
 * transport that connects to interfaces needs an interface address; posix
 * segments in the procfs or shm_open mode only (UCX_POSIX_USE_PROC_LINK=n
 * with a directory is refused: run with KVR_UCX_CHECK=0 then).  Other UCX versions: the parse
 * alone. */
#if UCP_API_MAJOR == 1 && UCP_API_MINOR == 13
#define UC_ATTR_CHECK 1
struct uc_entry {
    const void *dev_addr, *iface_addr;
    unsigned num_ep_addrs;
    struct {
        uint8_t lane;
        const void *addr;
    } ep_addrs[6];
    struct {
        uint64_t flags;
        double overhead, bandwidth;
        int priority;
        double lat_ovh;
        uint8_t dst_rsc_index;
        uint64_t atomic[4];
        size_t seg_size;
        int addr_version;
    } iface_attr;
    unsigned dev_num_paths;
    uint16_t tl_name_csum;
    uint8_t md_index, sys_dev, dev_index;
};
#endif
struct uc_unpacked {
    uint64_t uuid;
    char name[32];
    unsigned address_count;
    void *address_list;
    uint8_t spare[256]; /* should another version's be larger */
};

static bool sane(double v)
{
    return isfinite(v) && v >= 0;
}

/* the child: 0 when UCX parses the address and its figures are usable */
static int child_parse(struct ucx_engine *e, const uint8_t *padded)
{
    struct uc_unpacked u = {0};
    if (ucp_address_unpack(e->worker, padded, UNPACK_FLAGS, &u) != UCS_OK)
        return 1;
#ifdef UC_ATTR_CHECK
    if (u.address_count > 128)
        return 2;
    const struct uc_entry *a = u.address_list;
    /* transports whose is_reachable reads the interface address: it must be there */
    static const char *const by_iface[] = {"self", "cma",   "posix",    "sysv",   "tcp",
                                           "knem", "xpmem", "ud_verbs", "ud_mlx5"};
    uint16_t cs[sizeof(by_iface) / sizeof(by_iface[0])];
    for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++)
        cs[k] = ucs_crc16_string(by_iface[k]);
    for (unsigned i = 0; i < u.address_count; i++) {
        bool needs_iface = (a[i].iface_attr.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE) != 0;
        for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++)
            needs_iface = needs_iface || a[i].tl_name_csum == cs[k];
        if (a[i].num_ep_addrs > 6 || !sane(a[i].iface_attr.overhead) ||
            !sane(a[i].iface_attr.bandwidth) || !sane(a[i].iface_attr.lat_ovh) ||
            a[i].dev_num_paths == 0 || (!a[i].dev_addr && a[i].tl_name_csum != cs[0]) ||
            (!a[i].iface_addr && needs_iface))
            return 3; /* (a missing address: NULL dereference in is_reachable) */
        /* posix: the FIFO segment id leads the interface address; with neither
         * procfs (UCX's default, proc link) nor shm_open mode UCX wants a
         * directory name and asserts (mm_posix.c:369) */
        uint64_t seg;
        if (a[i].tl_name_csum == cs[2] && a[i].iface_addr &&
            (memcpy(&seg, a[i].iface_addr, 8), (seg & (3ull << 62)) == 0))
            return 4;
    }
#endif
    return 0;
}

uint8_t *ucx_check_pad(const void *src, size_t len)
{
    uint8_t *b = calloc(1, len + KVR_UCX_PAD);
    if (b)
        memcpy(b, src, len);
    return b;
}

/* runs UCX's address parse in a child; KVR_OK when it survived and succeeded */
static kvr_status_t check_in_child(struct ucx_engine *e, const uint8_t *padded, const char **why_p)
{
    const char *env = getenv("KVR_UCX_CHECK");
    if (env && strcmp(env, "0") == 0)
        return KVR_OK;
    pid_t c = fork();
    if (c < 0) {
        *why_p = "fork for the check failed";
        return KVR_ERR_IO;
    }
    if (c == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        signal(SIGALRM, SIG_DFL);
        alarm(1 + KVR_UCX_CHECK_MS / 1000); /* a second bound, should the parent die */
        _exit(child_parse(e, padded));
    }
    int pfd = (int)syscall(SYS_pidfd_open, c, 0);
    if (pfd >= 0) {
        struct pollfd pf = {.fd = pfd, .events = POLLIN};
        int r;
        while ((r = poll(&pf, 1, KVR_UCX_CHECK_MS)) < 0 && errno == EINTR)
            ;
        if (r == 0)
            kill(c, SIGKILL);
        close(pfd);
    }
    int st = 0;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return KVR_OK;
    *why_p = WIFSIGNALED(st) ? (WTERMSIG(st) == SIGKILL ? "UCX's parse did not finish in time"
                                                        : "UCX's parse crashed on it")
             : WEXITSTATUS(st) == 1 ? "UCX refused it"
                                    : "its interface figures are out of range";
    return KVR_ERR_CORRUPT;
}

kvr_status_t ucx_check_address(struct ucx_engine *e, const uint8_t *padded, const char **why_p)
{
    return check_in_child(e, padded, why_p);
}

kvr_status_t ucx_check_rkey(const uint8_t *rk, size_t len, const char **why_p)
{
    /* md_map (8 bytes), memory type (1), then per bit of md_map a size byte
     * and that many bytes of the MD's key; UCX's own protocol data may follow */
    if (len < 9) {
        *why_p = "shorter than its MD map and memory type";
        return KVR_ERR_CORRUPT;
    }
    uint64_t md_map;
    memcpy(&md_map, rk, 8);
    if (rk[8] >= UCS_MEMORY_TYPE_LAST) {
        *why_p = "unknown memory type";
        return KVR_ERR_CORRUPT;
    }
    size_t off = 9;
    for (; md_map; md_map &= md_map - 1) {
        if (off >= len || rk[off] > len - off - 1) {
            *why_p = "an MD's key runs past its end";
            return KVR_ERR_CORRUPT;
        }
        off += 1u + rk[off];
    }
    return KVR_OK;
}
