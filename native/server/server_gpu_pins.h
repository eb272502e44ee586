/*
 * server_gpu_pins.h - what the local client processes pin of the pool, as
 * they report it (PINS, protocol.h): each process's mappings of the pool
 * and the bytes each has registered with CUDA, for `gdrkv stat` and
 * /metrics. A report is the client's word and is trusted for nothing but
 * these figures; its bounds are checked all the same, and what one
 * process may keep is bounded (SERVER_GPU_PINS_MAPPINGS).
 *
 * Keyed by the unix peer's pid (SO_PEERCRED). A process is in the table
 * while it has a local connection open: every local connection joins at
 * accept and leaves at close, and a process's reports go with its last
 * connection. One table for all workers under one mutex: it is touched
 * at accept, at close and once per report, never per frame. Sized at
 * twice the most local connections there can be, so it never fills.
 */
#ifndef GDRKV_SERVER_GPU_PINS_H
#define GDRKV_SERVER_GPU_PINS_H

#include <stdint.h>
#include <sys/types.h>

#include "common/protocol.h"

/* Mappings of the pool one process may report: a process maps the pool
 * once per gdrkv client it opens on this server. */
#define SERVER_GPU_PINS_MAPPINGS 8

struct server_gpu_pins;

/* The figures `gdrkv stat` shows. */
struct server_gpu_pins_totals {
    uint64_t bytes;             /* all processes' reports, summed */
    uint64_t max_process_bytes; /* the most one process reports */
    uint64_t processes;         /* processes that report bytes pinned */
};

/* A table for at most max_conns local connections at a time; pool_bytes
 * bounds a mapping's report. NULL when out of memory. */
struct server_gpu_pins *server_gpu_pins_new(uint32_t max_conns, uint64_t pool_bytes);
void server_gpu_pins_free(struct server_gpu_pins *t);

/* The pid of a unix socket's peer, or 0 when the kernel can't say. */
pid_t server_gpu_pins_peer_pid(int fd);

/* A local connection of process pid opens, or closes; the process's
 * reports go when its last connection does. */
void server_gpu_pins_join(struct server_gpu_pins *t, pid_t pid);
void server_gpu_pins_leave(struct server_gpu_pins *t, pid_t pid);

/* Records process pid's report. 0; GDRKV_E_INVALID when its bytes exceed
 * the pool; GDRKV_E_TOO_LARGE when it names a mapping past the
 * process's SERVER_GPU_PINS_MAPPINGS; *why says which. A report older than
 * the mapping's last (seq not above it) changes nothing and is 0. */
int server_gpu_pins_report(struct server_gpu_pins *t, pid_t pid, const struct gk_pins *r,
                       const char **why);

void server_gpu_pins_totals(struct server_gpu_pins *t, struct server_gpu_pins_totals *out);

#endif
