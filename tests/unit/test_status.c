/* test_status.c - every status has a distinct name and text. */
#include "kvr_status.h"
#include "kvr_test.h"

int main(void)
{
    const char *seen[64] = {0};
    int n = 0;
    for (int s = KVR_ERR_INTERNAL; s <= KVR_INPROGRESS; s++) {
        const char *name = kvr_status_name((kvr_status_t)s);
        const char *text = kvr_status_str((kvr_status_t)s);
        KVR_CHECK(strncmp(name, "KVR_", 4) == 0 && strcmp(name, "KVR_?") != 0);
        KVR_CHECK(strcmp(text, "unknown status") != 0);
        for (int i = 0; i < n; i++)
            KVR_CHECK(strcmp(seen[i], text) != 0);
        seen[n++] = text;
    }
    KVR_CHECK(strcmp(kvr_status_str(KVR_ERR_TIMEOUT), "timed out") == 0);
    KVR_CHECK(strcmp(kvr_status_name(KVR_ERR_PEER_FAILURE), "KVR_ERR_PEER_FAILURE") == 0);
    KVR_CHECK(strcmp(kvr_status_str((kvr_status_t)-999), "unknown status") == 0);
    KVR_CHECK(strcmp(kvr_status_name((kvr_status_t)42), "KVR_?") == 0);
    KVR_CHECK_EQ(KVR_OK, 0);
    KVR_CHECK(KVR_STATUS_IS_ERR(KVR_ERR_INVALID) && !KVR_STATUS_IS_ERR(KVR_INPROGRESS));
    return 0;
}
