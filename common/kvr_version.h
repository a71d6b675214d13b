/* kvr_version.h: the one version line every binary prints for --version.
 * KVR_RELEASE is meson's project version (a configure_file header) and
 * KVR_GIT_REVISION the `git describe --dirty=+ --always` of the source tree
 * at build time (vcs_tag, "unknown" outside git), both generated in the
 * build directory by common/meson.build. */
#ifndef KVR_VERSION_H
#define KVR_VERSION_H

#include <stdio.h>

#include "kvr_release.h"
#include "kvr_revision.h"

#define KVR_VERSION_STRING KVR_RELEASE " (git " KVR_GIT_REVISION ")"

/* Prints "PROG VERSION (git REVISION)" and a newline to stdout. */
static inline void kvr_version_print(const char *prog)
{
    printf("%s %s\n", prog, KVR_VERSION_STRING);
}

#endif
