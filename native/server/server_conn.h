/*
 * server_conn.h - a client connection's bytes and frames: the non-blocking
 * state machine that reads a frame (header, body, and for PUT the payload
 * straight into reserved pool chunks), has it executed (server_ops.h), and
 * writes the answer (for GET the values straight from pinned chunks). The
 * struct and what a frame may hold are in server_state.h. A connection
 * belongs to the worker that accepted it and is only ever touched by that
 * worker's thread.
 */
#ifndef GDRKV_SERVER_CONN_H
#define GDRKV_SERVER_CONN_H

#include <stdint.h>

#include "server_peers.h"

struct gdrkv_server;
struct server_conn;
struct disk_frame;
struct server_worker;

/* Whether accept takes a connection's slots (server_conn_slot_take): for
 * every connection but a tcp one to a server with a token, which holds a
 * stranger's slot until AUTH (server_strangers.h) and takes them then. */
int server_conn_slot_at_accept(const struct gdrkv_server *s, int local);
/* Takes a connection's slots: one of max_connections (local and tcp
 * apart) and, for tcp, one of its peer's. 0, or -1 (counted as refused). */
int server_conn_slot_take(struct server_worker *w, int local, const struct server_peer *peer);
/* Gives back the slots server_conn_slot_take took. */
void server_conn_slot_give(struct gdrkv_server *s, int local, const struct server_peer *peer);
/* Takes over an accepted socket and the slots accept took for it, or takes
 * a stranger's slot for it. Returns 0; -2 when no stranger's slot is to be
 * had, -1 on a failure; then fd and the slots accept took are the
 * caller's. */
int server_conn_open(struct server_worker *w, int fd, int local, const struct server_peer *peer);
/* AUTH succeeded: c trades its stranger's slot for a client's. 0, or -1
 * when max_connections or its peer's share is full (c holds no slot then
 * and must end). */
int server_conn_authenticated(struct server_conn *c);
/* Runs the state machine as far as the socket allows (bounded, so one busy
 * client can't starve the others); may close and free c. A connection
 * stopped by the bound is marked runnable (and its worker too): the worker
 * must run it again without waiting for an event, which may never come. */
void server_conn_on_event(struct server_conn *c);
/* Runs again a frame parked for the disk (CONN_WAIT_DISK): its keys are
 * back in the pool (pinned by f, which c now owns), or not to be had. */
void server_conn_resume_after_disk(struct server_conn *c, struct disk_frame *f);
/* No frame in progress: every request read has been answered. */
int server_conn_between_frames(const struct server_conn *c);
/* Why the worker's tick must close c now, if it must. */
enum server_conn_overdue {
    CONN_OVERDUE_NO,
    CONN_OVERDUE_STALLED,   /* mid-frame, no byte moved for stall_timeout_ms */
    CONN_OVERDUE_REQUEST,   /* the request is not in by its deadline (size-scaled) */
    CONN_OVERDUE_ANSWER,    /* a tcp GET's pinned values not read by theirs */
    CONN_OVERDUE_IDLE,      /* no frame for idle_timeout_ms */
    CONN_OVERDUE_AUTH       /* not authenticated auth_timeout_ms after accept */
};
enum server_conn_overdue server_conn_overdue(const struct server_conn *c, uint64_t now_ns);
/* Releases what the frame holds in the store, closes and frees c. */
void server_conn_close(struct server_conn *c);

#endif
