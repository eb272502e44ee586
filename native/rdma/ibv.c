/*
 * ibv.c - see ibv.h. dlsym returns each symbol's default version, which
 * is the current ABI of every libibverbs since 1.1.
 */
#include "ibv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IBV_SYSTEM_LIB "libibverbs.so.1"

const char *gk_ibv_library(void)
{
    const char *env = getenv("GDRKV_IBVERBS_LIB");
    return env && *env ? env : IBV_SYSTEM_LIB;
}

static pthread_once_t ibv_once = PTHREAD_ONCE_INIT;
static struct gk_ibv ibv_table;
static const struct gk_ibv *ibv_loaded;
static char ibv_why[300];

/* Casting the void * from dlsym to a function pointer is what POSIX
 * specifies dlsym for; the union keeps -Wpedantic-style warnings away. */
static int resolve(void *lib, const char *name, void *slot, int required)
{
    union { void *obj; void (*fn)(void); } u = {.obj = dlsym(lib, name)};
    memcpy(slot, &u.fn, sizeof u.fn);
    if (!u.obj && required) {
        snprintf(ibv_why, sizeof ibv_why, "%s has no %s", gk_ibv_library(), name);
        return -1;
    }
    return 0;
}

static void load(void)
{
    const char *path = gk_ibv_library();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        snprintf(ibv_why, sizeof ibv_why, "cannot load %s: %s", path, err ? err : "unknown");
        return;
    }
    struct gk_ibv *t = &ibv_table;
    int bad = 0;
#define REQUIRE(field) bad |= resolve(lib, "ibv_" #field, &t->field, 1)
    REQUIRE(get_device_list);
    REQUIRE(free_device_list);
    REQUIRE(get_device_name);
    REQUIRE(open_device);
    REQUIRE(close_device);
    REQUIRE(query_device);
    REQUIRE(query_port);
    REQUIRE(query_gid);
    REQUIRE(alloc_pd);
    REQUIRE(dealloc_pd);
    REQUIRE(reg_mr);
    REQUIRE(dereg_mr);
    REQUIRE(create_cq);
    REQUIRE(destroy_cq);
    REQUIRE(create_qp);
    REQUIRE(modify_qp);
    REQUIRE(destroy_qp);
    REQUIRE(wc_status_str);
#undef REQUIRE
    resolve(lib, "ibv_reg_mr_iova2", &t->reg_mr_iova2, 0);
    resolve(lib, "ibv_reg_dmabuf_mr", &t->reg_dmabuf_mr, 0);
    if (bad) {
        dlclose(lib);
        return;
    }
    /* The library stays loaded for the life of the process: MRs and QPs
     * may outlive any one client. */
    ibv_loaded = t;
}

const struct gk_ibv *gk_ibv_load(const char **why)
{
    pthread_once(&ibv_once, load);
    if (!ibv_loaded && why)
        *why = ibv_why;
    return ibv_loaded;
}

