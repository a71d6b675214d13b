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
 *
 * Shared-memory keys.  UCX maps the segment a posix or sysv key names while
 * unpacking the rkey (open of /proc/PID/fd/FD or shm_open + mmap; shmat),
 * and when that fails UCX 1.13 destroys the half-made rkey and crashes
 * (SIGSEGV in uct_rkey_release): an rkey naming a segment that does not
 * exist killed the process.  Which of the peer's MDs are posix and sysv is
 * read from its worker address by the same child (the address entries'
 * md_index and transport name; passed back on a pipe); for a peer on this
 * host each such key is then checked here before UCX sees it: the segment
 * exists, is the peer's (procfs: its pid; shm_open: owned by its uid;
 * sysv: made by its pid) and holds the region.  Without the child's answer
 * (KVR_UCX_CHECK=0 skips both, another UCX version) keys are judged by
 * their form (a 12-byte key is sysv's, a posix one carries its mode bits).
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
#include <sys/shm.h>
#include <sys/stat.h>
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

/* the child: 0 when UCX parses the address and its figures are usable;
 * writes the peer's shared-memory MDs (struct ucx_shm_mds) to out_fd */
static int child_parse(struct ucx_engine *e, const uint8_t *padded, int out_fd)
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
    struct ucx_shm_mds shm = {.known = true};
    for (unsigned i = 0; i < u.address_count; i++) {
        if (a[i].md_index >= 64)
            return 5;
        if (a[i].tl_name_csum == cs[2])
            shm.posix |= 1ull << a[i].md_index;
        if (a[i].tl_name_csum == cs[3])
            shm.sysv |= 1ull << a[i].md_index;
    }
    if (write(out_fd, &shm, sizeof(shm)) != (ssize_t)sizeof(shm))
        return 6;
#else
    (void)out_fd;
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
static kvr_status_t check_in_child(struct ucx_engine *e, const uint8_t *padded,
                                   struct ucx_shm_mds *shm, const char **why_p)
{
    memset(shm, 0, sizeof(*shm));
    const char *env = getenv("KVR_UCX_CHECK");
    if (env && strcmp(env, "0") == 0)
        return KVR_OK;
    int pp[2];
    if (pipe2(pp, O_CLOEXEC | O_NONBLOCK) != 0) {
        *why_p = "pipe for the check failed";
        return KVR_ERR_IO;
    }
    pid_t c = fork();
    if (c < 0) {
        close(pp[0]);
        close(pp[1]);
        *why_p = "fork for the check failed";
        return KVR_ERR_IO;
    }
    if (c == 0) {
        close(pp[0]);
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        signal(SIGALRM, SIG_DFL);
        alarm(1 + KVR_UCX_CHECK_MS / 1000); /* a second bound, should the parent die */
        _exit(child_parse(e, padded, pp[1]));
    }
    close(pp[1]);
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
    struct ucx_shm_mds got;
    if (read(pp[0], &got, sizeof(got)) == (ssize_t)sizeof(got) && got.known)
        *shm = got;
    close(pp[0]);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return KVR_OK;
    *why_p = WIFSIGNALED(st) ? (WTERMSIG(st) == SIGKILL ? "UCX's parse did not finish in time"
                                                        : "UCX's parse crashed on it")
             : WEXITSTATUS(st) == 1 ? "UCX refused it"
                                    : "its interface figures are out of range";
    return KVR_ERR_CORRUPT;
}

kvr_status_t ucx_check_address(struct ucx_engine *e, const uint8_t *padded, struct ucx_shm_mds *shm,
                               const char **why_p)
{
    return check_in_child(e, padded, shm, why_p);
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

/* --- shared-memory keys --------------------------------------------------- */

/* UCX's posix key (mm_posix.c): segment id - flags in bits 60-63, then in
 * procfs mode the owner's pid (bits 0-29) and fd (bits 30-59), in shm_open
 * mode the name's number - address, length; sysv's (mm_sysv.c): shmid,
 * owner's address.  UCX maps the segment while unpacking the rkey (open +
 * mmap, or shmat), and in 1.13 a segment that is not there made it crash
 * in its own error path (the half-made rkey destroyed): so every such key
 * is checked here first. */
#define POSIX_PROCFS   (1ull << 63)
#define POSIX_SHM_OPEN (1ull << 62)
#define POSIX_FLAGS    (15ull << 60)
#define MASK30         0x3fffffffull
#define POSIX_KEY_LEN  24u
#define SYSV_KEY_LEN   12u

/* the uid the peer runs as (it owns its segments) */
static int peer_uid(pid_t pid, uid_t *uid)
{
    char path[32];
    struct stat st;
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    if (stat(path, &st) != 0)
        return -1;
    *uid = st.st_uid;
    return 0;
}

static kvr_status_t check_posix(const struct ucx_peer *p, const uint8_t *key, unsigned klen,
                                uint64_t region_len, char *why, size_t cap)
{
    uint64_t seg, length;
    if (klen < POSIX_KEY_LEN) {
        snprintf(why, cap, "a posix shared-memory key of %u bytes (at least %u)", klen,
                 POSIX_KEY_LEN);
        return KVR_ERR_CORRUPT;
    }
    memcpy(&seg, key, 8);
    memcpy(&length, key + 16, 8);
    char path[96];
    struct stat st;
    if (seg & POSIX_PROCFS) {
        int pid = (int)(seg & MASK30), fd = (int)((seg >> 30) & MASK30);
        if (pid != (int)p->pid) {
            snprintf(why, cap,
                     "its posix key names fd %d of pid %d, not a segment of the peer (pid %d)", fd,
                     pid, (int)p->pid);
            return KVR_ERR_CORRUPT;
        }
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
        if (stat(path, &st) != 0) {
            snprintf(why, cap, "its posix key names %s, which does not exist (%s)", path,
                     strerror(errno));
            return KVR_ERR_NOT_FOUND;
        }
    } else if (seg & POSIX_SHM_OPEN) {
        snprintf(path, sizeof(path), "/dev/shm/ucx_shm_posix_%llx",
                 (unsigned long long)(seg & ~POSIX_FLAGS));
        uid_t uid;
        if (stat(path, &st) != 0) {
            snprintf(why, cap, "its posix key names %s, which does not exist (%s)", path,
                     strerror(errno));
            return KVR_ERR_NOT_FOUND;
        }
        if (peer_uid(p->pid, &uid) != 0 || st.st_uid != uid) {
            snprintf(why, cap, "its posix key names %s, which the peer (pid %d) does not own", path,
                     (int)p->pid);
            return KVR_ERR_CORRUPT;
        }
    } else {
        snprintf(why, cap,
                 "its posix key names a segment in a directory (UCX_POSIX_USE_PROC_LINK=n), "
                 "a form kvrail does not accept");
        return KVR_ERR_CORRUPT;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < length || length < region_len) {
        snprintf(why, cap,
                 "its posix key names %s of %lld bytes for a segment of %llu (the region is %llu)",
                 path, (long long)st.st_size, (unsigned long long)length,
                 (unsigned long long)region_len);
        return KVR_ERR_CORRUPT;
    }
    return KVR_OK;
}

static kvr_status_t check_sysv(const struct ucx_peer *p, const uint8_t *key, unsigned klen,
                               uint64_t region_len, char *why, size_t cap)
{
    if (klen < SYSV_KEY_LEN) {
        snprintf(why, cap, "a sysv shared-memory key of %u bytes (at least %u)", klen,
                 SYSV_KEY_LEN);
        return KVR_ERR_CORRUPT;
    }
    int shmid;
    memcpy(&shmid, key, 4);
    struct shmid_ds ds;
    if (shmctl(shmid, IPC_STAT, &ds) != 0) {
        snprintf(why, cap, "its sysv key names segment %d, which %s (%s)", shmid,
                 errno == EACCES ? "this process may not read" : "does not exist", strerror(errno));
        return errno == EACCES ? KVR_ERR_CORRUPT : KVR_ERR_NOT_FOUND;
    }
    if (ds.shm_cpid != p->pid) {
        snprintf(why, cap, "its sysv key names segment %d of pid %d, not one of the peer (pid %d)",
                 shmid, (int)ds.shm_cpid, (int)p->pid);
        return KVR_ERR_CORRUPT;
    }
    if ((uint64_t)ds.shm_segsz < region_len) {
        snprintf(why, cap, "its sysv key names segment %d of %zu bytes, the region is %llu", shmid,
                 (size_t)ds.shm_segsz, (unsigned long long)region_len);
        return KVR_ERR_CORRUPT;
    }
    return KVR_OK;
}

kvr_status_t ucx_check_rkey_shm(const struct ucx_peer *p, const uint8_t *rk, size_t len,
                                uint64_t region_len, char *why, size_t cap)
{
    const char *env = getenv("KVR_UCX_CHECK");
    if (env && strcmp(env, "0") == 0)
        return KVR_OK;
    uint64_t md_map;
    memcpy(&md_map, rk, 8);
    size_t off = 9; /* (ucx_check_rkey: every key lies inside the len bytes) */
    for (; md_map && off < len; md_map &= md_map - 1) {
        unsigned md = (unsigned)__builtin_ctzll(md_map), klen = rk[off];
        const uint8_t *key = rk + off + 1;
        bool posix, sysv;
        if (p->shm.known) {
            posix = (p->shm.posix >> md) & 1;
            sysv = (p->shm.sysv >> md) & 1;
        } else { /* by its form: a sysv key is 12 bytes, a posix one says its mode */
            uint64_t seg = 0;
            if (klen >= POSIX_KEY_LEN)
                memcpy(&seg, key, 8);
            sysv = klen == SYSV_KEY_LEN;
            posix = !sysv && klen >= POSIX_KEY_LEN && (seg & (POSIX_PROCFS | POSIX_SHM_OPEN));
        }
        kvr_status_t s = posix  ? check_posix(p, key, klen, region_len, why, cap)
                         : sysv ? check_sysv(p, key, klen, region_len, why, cap)
                                : KVR_OK;
        if (s != KVR_OK)
            return s;
        off += 1u + klen;
    }
    return KVR_OK;
}
