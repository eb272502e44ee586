/*
 * server_options.h - the server's options, one table (server_options.c):
 * gdrkv_server_opts_init's defaults and gdrkv_server_option_at's entries
 * (from which gdrkv.Server's keywords, `gdrkv serve`'s flags, its TOML
 * keys and --print-config are made) come from it, and the check here is
 * the only validator of a gdrkv_server_opts.
 */
#ifndef GDRKV_SERVER_OPTIONS_H
#define GDRKV_SERVER_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "gdrkv.h"

struct gk_addr;

/* 0 when every option is in range, with the parsed listen address in
 * listen; else GDRKV_E_INVALID with the first fault, named, in err. */
int server_options_check(const gdrkv_server_opts *o, struct gk_addr *listen, char *err,
                         size_t errlen);
/* given, without its strings (which stay the caller's), into kept: the
 * options a running server reads. */
void server_options_keep(gdrkv_server_opts *kept, const gdrkv_server_opts *given);
/* How long a worker polls after an event: busy_poll_us, its auto (-1)
 * resolved for this host, in nanoseconds. */
uint64_t server_busy_poll_ns(int busy_poll_us);

#endif
