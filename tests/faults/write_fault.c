/* A write that fails on purpose: an LD_PRELOAD shim for fsdist's fault tests (tests/test_reliability.py).
 *
 * Every write, pwrite, writev and pwritev to a file whose path starts with $FAULT_PREFIX succeeds
 * $FAULT_AFTER times, then fails with errno $FAULT_ERRNO (default EIO) from then on, as a disk
 * that breaks or fills mid-job would. Other files (stdout, the checkpoint) are untouched.
 *     gcc -shared -fPIC -o write_fault.so write_fault.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long countdown = -1;
static const char *prefix;
static int fault_errno = EIO;

static int armed(int fd) {
    if (prefix == NULL) {
        const char *after = getenv("FAULT_AFTER"), *code = getenv("FAULT_ERRNO");
        prefix = getenv("FAULT_PREFIX") ? getenv("FAULT_PREFIX") : "";
        countdown = after ? atol(after) : -1;
        fault_errno = code ? atoi(code) : EIO;
    }
    if (!*prefix || countdown < 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    if (strncmp(path, prefix, strlen(prefix)) != 0) return 0;
    if (countdown > 0) { countdown--; return 0; }
    return 1;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
ssize_t write(int fd, const void *buf, size_t n) {
    static write_fn real;
    if (!real) real = (write_fn)dlsym(RTLD_NEXT, "write");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, buf, n);
}

typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    static pwrite_fn real;
    if (!real) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, buf, n, off);
}

typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off_t);
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    static pwrite64_fn real;
    if (!real) real = (pwrite64_fn)dlsym(RTLD_NEXT, "pwrite64");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, buf, n, off);
}

typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    static writev_fn real;
    if (!real) real = (writev_fn)dlsym(RTLD_NEXT, "writev");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, iov, cnt);
}

typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    static pwritev_fn real;
    if (!real) real = (pwritev_fn)dlsym(RTLD_NEXT, "pwritev");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, iov, cnt, off);
}

typedef ssize_t (*pwritev64_fn)(int, const struct iovec *, int, off_t);
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    static pwritev64_fn real;
    if (!real) real = (pwritev64_fn)dlsym(RTLD_NEXT, "pwritev64");
    if (armed(fd)) { errno = fault_errno; return -1; }
    return real(fd, iov, cnt, off);
}

