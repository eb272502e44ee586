/*
 * server_worker.h - a worker thread: one epoll loop that accepts, runs its
 * connections (server_conn.h) and, every SERVER_TICK_MS, expires holds and
 * closes connections stalled mid-frame.
 */
#ifndef GDRKV_SERVER_WORKER_H
#define GDRKV_SERVER_WORKER_H

struct gdrkv_server;
struct server_worker;

/* Sets up w (epoll, scratch); cleans up after itself when it fails. */
int server_worker_init(struct server_worker *w, struct gdrkv_server *s);
void *server_worker_main(void *arg);
void server_worker_destroy(struct server_worker *w);

#endif
