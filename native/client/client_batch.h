/*
 * client_batch.h - a call planned: client_batch.c checks, routes and
 * stripes the keys into jobs and frames (client_state.h), client_run.c
 * drives them.
 */
#ifndef GDRKV_CLIENT_BATCH_H
#define GDRKV_CLIENT_BATCH_H

#include "client_state.h"

struct gdrkv_client;

/* Drives every job of call until each frame is answered or failed, or the
 * deadline passes (client_run.c). */
void client_run(struct gdrkv_client *c, struct client_call *call);

#endif
