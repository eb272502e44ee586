/*
 * server_disk.h - reads that wait for the disk tier. A GET or LEASE of keys
 * that are on disk only is parked: its namespace and keys, copied, go to
 * the server's disk threads, which read them back into the pool
 * (store_promote_batch) and hand the frame, which names its connection by
 * serial, to the worker that owns it (its disk_done list and disk_fd);
 * that worker then runs the frame again and finds them there
 * (server_worker.c). A network worker never waits for a disk, so in-memory
 * hits of every other connection keep flowing.
 *
 * On a server with a disk tier, every GET and LEASE first pins the keys it
 * finds in the pool (store_hold_batch), and the disk threads pin those
 * they bring back: all stay pinned until the frame has run and pinned them
 * itself, so nothing (the demoter, another reader's promotions) evicts
 * them in between and the reader misses a key it was about to read.
 *
 * The jobs hold no pointer a worker may free: a connection closed while
 * its keys are read is looked up by its serial when the frame comes back,
 * and simply not found; its pins go then.
 *
 * Writes wait for the disk tier too, under the throttle policy: a PUT the
 * pool has no room for but by evicting objects not on disk yet waits
 * (CONN_WAIT_ROOM, server_ops.h SERVER_OPS_WAIT_ROOM) holding nothing, and
 * the store's room hook, set here, wakes every worker through its disk_fd
 * whenever the demoter wrote some, so their waiting writes try again.
 */
#ifndef GDRKV_SERVER_DISK_H
#define GDRKV_SERVER_DISK_H

#include <stdint.h>

struct gdrkv_server;
struct server_conn;
struct disk_frame;

/* Starts the disk threads when the store has a disk tier: 0, or -1. */
int server_disk_start(struct gdrkv_server *s);
/* Stops them (after the workers ended); jobs not done are dropped. */
void server_disk_stop(struct gdrkv_server *s);

/* For an executing GET or LEASE: 1 when its keys went to the disk threads
 * and the connection must wait (CONN_WAIT_DISK), 0 to run it now (with
 * c->disk_frame holding its keys, when the store has a disk tier). */
int server_disk_park(struct server_conn *c);
/* The connection a frame back from the disk threads belongs to. */
uint64_t server_disk_serial(const struct disk_frame *f);
/* Lets the frame's pins go and frees it (after its connection ran it
 * again, or when that connection is gone); NULL is nothing. */
void server_disk_release(struct disk_frame *f);

#endif
