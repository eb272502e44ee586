/*
 * client.h - the map of the client wing (native/client/). The public API
 * is include/gdrkv.h; every public operation goes down these files, each
 * including only the headers of the files below it:
 *
 *   client.c          public API: options, registration, stats
 *   client_table.c    the server table: an immutable snapshot of the members,
 *                     swapped whole (gdrkv_client_set_members); gdrkv_place
 *   client_keyed.c    a keyed call's passes: replicas, fail-over, read-through
 *   client_call.c     plan: a pass -> checked, routed, striped keys -> jobs and frames
 *   client_run.c      run: connections for the jobs, the one poll loop, outcomes
 *   client_server.c   server: its endpoint, idle connections, health and backoff
 *   client_conn.c     conn: connect, send, receive, header checks; the exchange
 *                     chosen per frame from its transport's, the plain one here
 *   client_shm.c      shm: unix socket, HELLO, pool mapping, the shm exchanges
 *                     and their copy plans (the copies themselves: common/copy.c)
 *   client_rdma.c     rdma: device, MRs, QPs per connection, the rdma exchanges,
 *                     READs and WRITEs stepped by the poll loop
 *   client_frame.c    what every exchange is built from: the exchange row, request
 *                     encoding, results and chunk lists of answers, follow-ups
 *   client_gpu.c      gpu: a connection's GPU staging, per-frame table, launches
 *   client_gpu_call.c gpu: which segments of a call are GPU memory
 *   client_chunks.c   chunk lists of LEASE/RESERVE answers laid over segments
 *   client_iov.c      a frame's bytes as iovec windows over caller segments
 *   client_regions.c  registered memory ranges
 *   placement.c       weighted rendezvous hashing, replicas over failure domains
 *   route.c           the key and server hashes placement scores
 *
 * client_state.h, at the bottom, holds the structs they share: the client,
 * its counters, the pool mapping, and a call's batch, frames and jobs.
 */
#ifndef GDRKV_CLIENT_H
#define GDRKV_CLIENT_H

#include "client_state.h"

#endif
