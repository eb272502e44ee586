/*
 * refuse_seals.c - an LD_PRELOAD shim for tests: fcntl(F_ADD_SEALS) fails
 * with EINVAL, as on kernels older than 5.1 (no F_SEAL_FUTURE_WRITE).
 * Every other fcntl goes through. test_shm_trust.py builds it with cc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>

typedef int (*fcntl_fn)(int, int, ...);

/* fcntl's third argument is an int or a pointer; glibc reads it as a
 * pointer-sized word either way, and so does this. */
static int refuse_or_pass(const char *name, int fd, int cmd, void *arg)
{
    if (cmd == F_ADD_SEALS) {
        errno = EINVAL;
        return -1;
    }
    fcntl_fn real = (fcntl_fn)dlsym(RTLD_NEXT, name);
    return real(fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return refuse_or_pass("fcntl", fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return refuse_or_pass("fcntl64", fd, cmd, arg);
}
