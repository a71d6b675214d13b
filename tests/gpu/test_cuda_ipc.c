/*
 * test_cuda_ipc.c - the "cuda_ipc" transfer backend (transport/cuda/).
 *
 * Without a GPU (CI) it checks what runs there: the backend is registered;
 * two engines connect (address blobs, the same host); notifications arrive
 * whole and in order; a datagram sent to an engine's socket by another user
 * (a child that drops to uid 65534) is dropped, not delivered; device memory
 * and posts without a GPU fail with the reason; require_rdma is refused.
 *
 * With a GPU (tests/gpu/run-device.sh) it also runs the data path between
 * two processes: a target (this program, --target) registers 64 MiB of
 * device memory 1 MiB into a cudaMalloc allocation (the rkey's offset) and
 * sends its address and rkey; this process pushes, from a region of
 * kvr_xfer_mem_alloc (cudaMalloc inside the backend), 4,096
 * scattered 16 KiB blocks (a list, coalesced where adjacent) from its own
 * device memory and sends a notification right after the post, without
 * waiting: the target checks, on the notification, that every block holds
 * the pattern (the notification is ordered after the copies).
 *
 * Exit 0: all checks passed (the GPU part skipped, saying so, without a GPU).
 */
#include <errno.h>
#include <pwd.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "kvr_clock.h"
#include "kvr_cuda.h"
#include "kvr_xfer.h"
#include "kvr_test.h"

extern char **environ;

struct inbox {
    int n;
    char msgs[16][64];
};

static void on_notif(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    (void)token;
    struct inbox *b = arg;
    if (b->n < 16 && len < 64) {
        memcpy(b->msgs[b->n], msg, len);
        b->msgs[b->n][len] = 0;
    }
    b->n++;
}

static kvr_xfer_engine_t *engine(const char *name, struct inbox *box, int require_rdma)
{
    struct kvr_xfer_config c;
    kvr_xfer_config_init(&c);
    c.backend = "cuda_ipc";
    c.name = name;
    c.require_rdma = require_rdma;
    c.notif_cb = on_notif;
    c.notif_arg = box;
    kvr_xfer_engine_t *e = NULL;
    kvr_status_t s = kvr_xfer_engine_create(&c, &e);
    if (s != KVR_OK)
        return NULL;
    return e;
}

/* progresses both until box holds want messages, or 5 s */
static void pump(kvr_xfer_engine_t *a, kvr_xfer_engine_t *b, struct inbox *box, int want)
{
    uint64_t end = kvr_now_ns() + 5000000000ull;
    while (box->n < want && kvr_now_ns() < end) {
        kvr_xfer_progress(a);
        if (b)
            kvr_xfer_progress(b);
    }
}

/* the engine's socket name, from its address blob */
static int sock_name(kvr_xfer_engine_t *e, char *out, size_t cap)
{
    void *blob;
    size_t len;
    if (kvr_xfer_address(e, &blob, &len) != KVR_OK)
        return -1;
    const char *pfx = "kvrail-cuda-ipc-";
    const char *p = memmem(blob, len, pfx, strlen(pfx));
    int rc = p ? 0 : -1;
    if (p)
        snprintf(out, cap, "%s", p);
    free(blob);
    return rc;
}

static void cpu_part(void)
{
    const char *const *names = kvr_xfer_backends();
    int found = 0;
    for (size_t i = 0; names[i]; i++)
        found |= !strcmp(names[i], "cuda_ipc");
    KVR_EXPECT(found, "cuda_ipc is not among the backends of a CUDA build");

    struct inbox ba = {0}, bb = {0};
    KVR_EXPECT(!engine("rdma", &ba, 1), "require_rdma accepted by cuda_ipc");
    kvr_xfer_engine_t *a = engine("a", &ba, 0), *b = engine("b", &bb, 0);
    KVR_EXPECT(a && b, "engine create failed");
    if (!a || !b)
        return;
    void *blob;
    size_t len;
    KVR_EXPECT(kvr_xfer_address(b, &blob, &len) == KVR_OK, "address");
    kvr_xfer_peer_t *p = NULL;
    KVR_EXPECT(kvr_xfer_connect(a, blob, len, &p) == KVR_OK && p, "connect a -> b");
    free(blob);
    if (!p)
        return;
    KVR_EXPECT(!strcmp(kvr_xfer_peer_transports(p), "cuda_ipc/copy-engine"), "transports: %s",
               kvr_xfer_peer_transports(p));
    const char *m[] = {"one", "two", "three"};
    for (int i = 0; i < 3; i++)
        KVR_EXPECT(kvr_xfer_notify(p, m[i], strlen(m[i])) == KVR_OK, "notify %d", i);
    pump(a, b, &bb, 3);
    KVR_EXPECT(bb.n == 3, "%d notifications arrived, want 3", bb.n);
    for (int i = 0; i < 3 && i < bb.n; i++)
        KVR_EXPECT(!strcmp(bb.msgs[i], m[i]), "notification %d is '%s', want '%s'", i, bb.msgs[i],
                   m[i]);
    KVR_EXPECT(kvr_xfer_flush(p, 2000) == KVR_OK, "flush after the notifications");

    /* another user's datagram is dropped */
    char name[64];
    KVR_EXPECT(sock_name(b, name, sizeof name) == 0, "no socket name in b's address");
    if (getuid() == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0)
                _exit(3);
            int s = socket(AF_UNIX, SOCK_DGRAM, 0);
            struct sockaddr_un sa = {.sun_family = AF_UNIX};
            memcpy(sa.sun_path + 1, name, strlen(name));
            ssize_t w =
                sendto(s, "forged", 6, 0, (struct sockaddr *)&sa,
                       (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name)));
            _exit(w == 6 ? 0 : 4);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        KVR_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other user's sendto failed (%d)",
                   st);
        for (int i = 0; i < 1000; i++)
            kvr_xfer_progress(b);
        KVR_EXPECT(bb.n == 3, "a datagram of another user was delivered (%d notifications)", bb.n);
    } else {
        printf("(not root: the foreign-user datagram check needs setuid; skipped)\n");
    }

    /* device memory without a GPU: a clear error, not a crash */
    if (kvr_cuda_device() < 0) {
        char host[4096];
        kvr_xfer_mem_t *mem = NULL;
        kvr_status_t s = kvr_xfer_mem_reg(a, host, sizeof host, KVR_MEM_CUDA, 0, &mem);
        KVR_EXPECT(s != KVR_OK && !mem, "device memory registered without a GPU");
    }
    kvr_xfer_disconnect(p);
    kvr_xfer_engine_destroy(a);
    kvr_xfer_engine_destroy(b);
    printf("cpu part: backend, connect, ordered notifications, foreign datagram dropped, "
           "no-GPU refusal: %s\n",
           kvr_test_fails ? "FAILED" : "OK");
}

/* ------------------------------------------------------------ GPU part */

#define REGION  (64u << 20)
#define BLOCK   16384u
#define NBLOCKS 4096u

static void put_blob(const void *b, size_t n)
{
    uint32_t l = (uint32_t)n;
    fwrite(&l, 4, 1, stdout);
    fwrite(b, 1, n, stdout);
}

static void *get_blob(FILE *f, size_t *n)
{
    uint32_t l;
    if (fread(&l, 4, 1, f) != 1 || l > (1u << 20))
        return NULL;
    void *b = malloc(l);
    if (b && fread(b, 1, l, f) != l) {
        free(b);
        return NULL;
    }
    *n = l;
    return b;
}

/* block i of the push lands at block dst_block(i) of the target's region:
 * groups of 4 adjacent blocks (coalesced into one copy), the groups
 * scattered by a permutation (7919 is odd, so k -> 7919 k mod 1024 is one) */
static uint64_t dst_block(uint32_t i)
{
    return (uint64_t)((i / 4) * 7919u % (REGION / BLOCK / 4)) * 4 + i % 4;
}

static int target(void)
{
    char err[256];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "target: %s\n", err);
        return 1;
    }
    struct inbox box = {0};
    kvr_xfer_engine_t *e = engine("target", &box, 0);
    /* the region 1 MiB into its allocation: the rkey carries the offset */
    void *alloc, *d;
    if (!e || cudaMalloc(&alloc, REGION + (1u << 20)) != cudaSuccess ||
        cudaMemset(alloc, 0, REGION + (1u << 20)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) /* zeroed before the pusher writes */
        return 1;
    d = (char *)alloc + (1u << 20);
    kvr_xfer_mem_t *m;
    void *a, *k;
    size_t al, kl;
    if (kvr_xfer_mem_reg(e, d, REGION, KVR_MEM_CUDA, 0, &m) != KVR_OK ||
        kvr_xfer_address(e, &a, &al) != KVR_OK || kvr_xfer_mem_pack(m, &k, &kl) != KVR_OK)
        return 1;
    put_blob(a, al);
    put_blob(k, kl);
    fflush(stdout);
    uint64_t end = kvr_now_ns() + 20000000000ull;
    while (box.n < 1 && kvr_now_ns() < end)
        kvr_xfer_progress(e);
    if (box.n < 1) {
        fprintf(stderr, "target: no notification in 20 s\n");
        return 1;
    }
    /* on the notification: every pushed block is there */
    unsigned char *h = malloc(REGION);
    if (!h || cudaMemcpy(h, d, REGION, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    uint32_t bad = 0;
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        const unsigned char *blk = h + dst_block(i) * BLOCK;
        for (uint32_t j = 0; j < BLOCK; j += 512)
            if (blk[j] != (unsigned char)(i * 31 + j / 512 + 1)) {
                bad++;
                break;
            }
    }
    fprintf(stderr, "target: notification '%s'; %u of %u blocks wrong\n", box.msgs[0], bad,
            NBLOCKS);
    /* serve the timed pushes until "done" (or 30 s) */
    end = kvr_now_ns() + 30000000000ull;
    while (box.n < 2 && kvr_now_ns() < end)
        kvr_xfer_progress(e);
    free(h);
    kvr_xfer_mem_dereg(m);
    kvr_xfer_engine_destroy(e);
    cudaFree(alloc);
    return bad ? 2 : 0;
}

/* The push through the backend (post to completion, 7 times, median)
 * against cudaMemcpyAsync device to device of the same coalesced segments
 * into this process's own memory: the "IPC push vs D2D" ratio. */
static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void time_push(kvr_xfer_dlist_t *dl, const struct kvr_xfer_desc *ds, kvr_xfer_mem_t *lm)
{
    enum { REPS = 7 };
    uint64_t ti[REPS], td[REPS];
    void *local = NULL;
    cudaStream_t st;
    cudaEvent_t ev;
    if (cudaMalloc(&local, REGION) != cudaSuccess ||
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        KVR_EXPECT(0, "timing setup");
        return;
    }
    char *src = kvr_xfer_mem_addr(lm);
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = kvr_now_ns();
        kvr_status_t s = kvr_xfer_post(dl);
        if (s == KVR_INPROGRESS)
            s = kvr_xfer_wait(dl, 10000);
        ti[r] = kvr_now_ns() - t0;
        KVR_EXPECT(s == KVR_OK, "timed push %d: %s", r, kvr_status_str(s));
        t0 = kvr_now_ns();
        for (uint32_t i = 0; i < NBLOCKS;) { /* the same runs of adjacent blocks */
            uint32_t e = i + 1;
            while (e < NBLOCKS && ds[e].roff == ds[e - 1].roff + BLOCK &&
                   ds[e].loff == ds[e - 1].loff + BLOCK)
                e++;
            cudaMemcpyAsync((char *)local + ds[i].roff, src + ds[i].loff, (size_t)(e - i) * BLOCK,
                            cudaMemcpyDeviceToDevice, st);
            i = e;
        }
        cudaEventRecord(ev, st);
        cudaEventSynchronize(ev);
        td[r] = kvr_now_ns() - t0;
    }
    qsort(ti, REPS, sizeof ti[0], cmp_u64);
    qsort(td, REPS, sizeof td[0], cmp_u64);
    double mi = (double)ti[REPS / 2] / 1e6, md = (double)td[REPS / 2] / 1e6;
    double mb = (double)NBLOCKS * BLOCK / 1048576.0;
    printf("\n| %.0f MiB in %u blocks of %u KiB | ms (median of %d) | GB/s | vs D2D |\n"
           "|---|---|---|---|\n"
           "| cudaMemcpyAsync D2D, same process | %.3f | %.1f | 1.00 |\n"
           "| cuda_ipc push to another process (post to completion) | %.3f | %.1f | %.2f |\n",
           mb, NBLOCKS, BLOCK / 1024, REPS, md, mb * 1.048576e-3 / (md / 1e3), mi,
           mb * 1.048576e-3 / (mi / 1e3), md / mi);
    cudaEventDestroy(ev);
    cudaStreamDestroy(st);
    cudaFree(local);
}

static void gpu_part(void)
{
    int to[2], from[2];
    if (pipe(to) || pipe(from))
        exit(1);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    posix_spawn_file_actions_addclose(&fa, to[1]);
    posix_spawn_file_actions_addclose(&fa, from[0]);
    char *argv[] = {(char *)"test_cuda_ipc", (char *)"--target", NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ) != 0) {
        KVR_EXPECT(0, "spawn the target");
        return;
    }
    close(to[0]);
    close(from[1]);
    FILE *f = fdopen(from[0], "r");
    size_t al = 0, kl = 0;
    void *a = get_blob(f, &al), *k = a ? get_blob(f, &kl) : NULL;
    KVR_EXPECT(a && k, "no address / rkey from the target");
    struct inbox box = {0};
    kvr_xfer_engine_t *e = engine("pusher", &box, 0);
    void *src = NULL;
    unsigned char *h = malloc((size_t)NBLOCKS * BLOCK);
    for (uint32_t i = 0; h && i < NBLOCKS; i++)
        for (uint32_t j = 0; j < BLOCK; j++)
            h[(size_t)i * BLOCK + j] = (unsigned char)(i * 31 + j / 512 + 1);
    kvr_xfer_mem_t *lm = NULL;
    kvr_xfer_peer_t *p = NULL;
    kvr_xfer_rmem_t *rm = NULL;
    kvr_xfer_dlist_t *dl = NULL;
    struct kvr_xfer_desc *ds = calloc(NBLOCKS, sizeof *ds);
    /* the source from kvr_xfer_mem_alloc (cudaMalloc'd, registered) */
    if (a && k && e && h && ds &&
        kvr_xfer_mem_alloc(e, (size_t)NBLOCKS * BLOCK, KVR_MEM_CUDA, 0, &lm) == KVR_OK &&
        (src = kvr_xfer_mem_addr(lm)) != NULL &&
        cudaMemcpy(src, h, (size_t)NBLOCKS * BLOCK, cudaMemcpyHostToDevice) == cudaSuccess) {
        KVR_EXPECT(kvr_xfer_connect(e, a, al, &p) == KVR_OK, "connect to the target");
        KVR_EXPECT(p && kvr_xfer_rmem_unpack(p, k, kl, &rm) == KVR_OK, "unpack the target's rkey");
        for (uint32_t i = 0; i < NBLOCKS; i++)
            ds[i] =
                (struct kvr_xfer_desc){lm, (uint64_t)i * BLOCK, rm, dst_block(i) * BLOCK, BLOCK};
        size_t co = 0;
        KVR_EXPECT(rm && lm &&
                       kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, ds, NBLOCKS, &dl) == KVR_OK,
                   "prepare");
        if (dl) {
            kvr_xfer_dlist_count(dl, &co);
            kvr_status_t s = kvr_xfer_post(dl);
            KVR_EXPECT(s == KVR_OK || s == KVR_INPROGRESS, "post: %s", kvr_status_str(s));
            KVR_EXPECT(kvr_xfer_notify(p, "pushed", 6) == KVR_OK, "notify right after the post");
            KVR_EXPECT(kvr_xfer_wait(dl, 10000) == KVR_OK, "the push completes");
            KVR_EXPECT(kvr_xfer_flush(p, 10000) == KVR_OK, "flush");
            printf("gpu part: %u blocks in %zu copies pushed over %s\n", NBLOCKS, co,
                   kvr_xfer_peer_transports(p));
            time_push(dl, ds, lm);
            KVR_EXPECT(kvr_xfer_notify(p, "done", 4) == KVR_OK &&
                           kvr_xfer_flush(p, 10000) == KVR_OK,
                       "the last notification");
        }
    } else {
        KVR_EXPECT(0, "GPU setup of the pusher");
    }
    close(to[1]);
    int st = 0;
    waitpid(pid, &st, 0);
    KVR_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0,
               "the target saw wrong blocks at the notification (or failed): status %d", st);
    if (dl)
        kvr_xfer_dlist_release(dl);
    if (rm)
        kvr_xfer_rmem_release(rm);
    if (p)
        kvr_xfer_disconnect(p);
    if (lm)
        kvr_xfer_mem_dereg(lm);
    if (e)
        kvr_xfer_engine_destroy(e);
    free(h);
    free(ds);
    free(a);
    free(k);
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--target"))
        return target();
    cpu_part();
    char err[256];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK) {
        printf("gpu part skipped: %s\n", err);
    } else {
        gpu_part();
        printf("gpu part: %s\n", kvr_test_fails ? "FAILED" : "OK");
    }
    return kvr_test_fails ? 1 : 0;
}
