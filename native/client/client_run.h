/*
 * client_run.h - one call's jobs driven to the end: a connection checked
 * out for each, every frame of every server moved in one poll() loop in
 * the calling thread, then the connections checked back in and each server
 * told how it went.
 */
#ifndef GDRKV_CLIENT_RUN_H
#define GDRKV_CLIENT_RUN_H

#include "client_state.h"

/* Drives every job of call until each frame is answered or failed, or the
 * deadline passes. */
void client_run(struct gdrkv_client *c, struct client_call *call);

#endif
