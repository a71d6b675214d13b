/*
 * test_nccl.c - the NCCL pair communicator (transport/nccl/kvr_nccl.h).
 *
 * What a CPU runs: the ncclResult_t mapping; the id blob round trip and its
 * refusals (length, magic, blob version, another NCCL major version); a
 * pair opened with no GPU fails with a status, not a crash.
 * What needs two GPUs (NCCL takes one GPU a rank) and runs only where
 * cudaGetDeviceCount >= 2: rank 1 in a child process on GPU 1, rank 0 here
 * on GPU 0, 64 blocks of 64 KiB sent and checked byte for byte.  With one
 * GPU or none that part is reported as not run.
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "kvr_cuda.h"
#include "kvr_nccl.h"
#include "kvr_test.h"

extern char **environ;

#define NB  64
#define BLK 65536

static int rank1(const char *hex)
{
    unsigned char blob[KVR_NCCL_BLOB_LEN];
    for (int i = 0; i < KVR_NCCL_BLOB_LEN; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 3;
        blob[i] = (unsigned char)v;
    }
    char err[512];
    ncclUniqueId id;
    kvr_nccl_pair_t *p;
    void *d, *blocks[NB];
    if (kvr_nccl_blob_parse(blob, sizeof blob, &id, err, sizeof err) != KVR_OK ||
        kvr_cuda_device_open(1, 0, err, sizeof err) != KVR_OK ||
        kvr_nccl_pair_open(&id, 1, 30000, &p, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "rank 1: %s\n", err);
        return 1;
    }
    if (cudaMalloc(&d, (size_t)NB * BLK) != cudaSuccess)
        return 1;
    for (int i = 0; i < NB; i++) /* received in reverse order of the memory */
        blocks[i] = (char *)d + (size_t)(NB - 1 - i) * BLK;
    if (kvr_nccl_pair_move(p, blocks, NB, BLK) != KVR_OK || kvr_nccl_pair_wait(p, 30000) != KVR_OK)
        return 1;
    unsigned char *h = malloc((size_t)NB * BLK);
    cudaMemcpy(h, d, (size_t)NB * BLK, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < BLK; j += 1024)
            bad += h[(size_t)(NB - 1 - i) * BLK + (size_t)j] != (unsigned char)(i * 3 + j / 1024);
    kvr_nccl_pair_close(p);
    return bad ? 2 : 0;
}

static void cpu_part(void)
{
    KVR_EXPECT(kvr_nccl_status(ncclSuccess) == KVR_OK &&
                   kvr_nccl_status(ncclInProgress) == KVR_INPROGRESS &&
                   kvr_nccl_status(ncclInvalidUsage) == KVR_ERR_INVALID &&
                   kvr_nccl_status(ncclSystemError) == KVR_ERR_IO &&
                   kvr_nccl_status(ncclRemoteError) == KVR_ERR_PEER_FAILURE &&
                   kvr_nccl_status(ncclInternalError) == KVR_ERR_INTERNAL,
               "ncclResult_t mapping");
    ncclUniqueId id, back;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id.internal[i] = (char)(i * 5 + 1);
    unsigned char blob[KVR_NCCL_BLOB_LEN];
    kvr_nccl_blob_pack(&id, blob);
    char err[256];
    KVR_EXPECT(kvr_nccl_blob_parse(blob, sizeof blob, &back, err, sizeof err) == KVR_OK &&
                   memcmp(&id, &back, sizeof id) == 0,
               "round trip: %s", err);
    KVR_EXPECT(kvr_nccl_blob_parse(blob, sizeof blob - 1, &back, err, sizeof err) ==
                   KVR_ERR_INVALID,
               "a short blob");
    unsigned char bad[KVR_NCCL_BLOB_LEN];
    memcpy(bad, blob, sizeof bad);
    bad[0] = 'X';
    KVR_EXPECT(kvr_nccl_blob_parse(bad, sizeof bad, &back, err, sizeof err) == KVR_ERR_INVALID,
               "bad magic");
    memcpy(bad, blob, sizeof bad);
    bad[4] = 9;
    KVR_EXPECT(kvr_nccl_blob_parse(bad, sizeof bad, &back, err, sizeof err) == KVR_ERR_VERSION,
               "blob version 9");
    memcpy(bad, blob, sizeof bad);
    uint32_t other = NCCL_VERSION_CODE + 10000; /* next major */
    for (int i = 0; i < 4; i++)
        bad[6 + i] = (unsigned char)(other >> (8 * i));
    KVR_EXPECT(kvr_nccl_blob_parse(bad, sizeof bad, &back, err, sizeof err) == KVR_ERR_VERSION &&
                   strstr(err, "major"),
               "another NCCL major: %s", err);
    if (kvr_cuda_device() < 0) {
        kvr_nccl_pair_t *p = NULL;
        kvr_status_t s = kvr_nccl_pair_open(&id, 0, 1000, &p, err, sizeof err);
        KVR_EXPECT(s != KVR_OK && !p, "a pair opened without a GPU");
    }
    printf("cpu part (status mapping, id blob and its refusals, no-GPU refusal): %s\n",
           kvr_test_fails ? "FAILED" : "OK");
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--rank1"))
        return rank1(argv[2]);
    cpu_part();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        (void)cudaGetLastError();
        printf("two-GPU part not run: %d GPU(s) here, NCCL needs one a rank\n", n);
        return kvr_test_fails ? 1 : 0;
    }
    char err[512];
    unsigned char blob[KVR_NCCL_BLOB_LEN];
    KVR_EXPECT(kvr_cuda_device_open(0, 0, err, sizeof err) == KVR_OK, "%s", err);
    KVR_EXPECT(kvr_nccl_blob_new(blob, err, sizeof err) == KVR_OK, "%s", err);
    char hex[2 * KVR_NCCL_BLOB_LEN + 1];
    for (int i = 0; i < KVR_NCCL_BLOB_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", blob[i]);
    char *cargv[] = {(char *)"test_nccl", (char *)"--rank1", hex, NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, cargv, environ) != 0) {
        KVR_EXPECT(0, "spawn rank 1");
        return 1;
    }
    ncclUniqueId id;
    kvr_nccl_pair_t *p = NULL;
    void *d = NULL, *blocks[NB];
    unsigned char *h = malloc((size_t)NB * BLK);
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < BLK; j++)
            h[(size_t)i * BLK + (size_t)j] = (unsigned char)(i * 3 + j / 1024);
    if (kvr_nccl_blob_parse(blob, sizeof blob, &id, err, sizeof err) == KVR_OK &&
        kvr_nccl_pair_open(&id, 0, 30000, &p, err, sizeof err) == KVR_OK &&
        cudaMalloc(&d, (size_t)NB * BLK) == cudaSuccess &&
        cudaMemcpy(d, h, (size_t)NB * BLK, cudaMemcpyHostToDevice) == cudaSuccess) {
        for (int i = 0; i < NB; i++)
            blocks[i] = (char *)d + (size_t)i * BLK;
        KVR_EXPECT(kvr_nccl_pair_move(p, blocks, NB, BLK) == KVR_OK, "send");
        KVR_EXPECT(kvr_nccl_pair_wait(p, 30000) == KVR_OK, "send completes");
    } else {
        KVR_EXPECT(0, "rank 0: %s", err);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    KVR_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 saw other bytes or failed: %d", st);
    printf("two-GPU part (%d blocks of %d KiB, P rank 0 -> D rank 1): %s\n", NB, BLK / 1024,
           kvr_test_fails ? "FAILED" : "OK");
    kvr_nccl_pair_close(p);
    cudaFree(d);
    free(h);
    return kvr_test_fails ? 1 : 0;
}
