/*
 * errors.h - an error code with its message, for calls that fill a
 * caller's (err, errlen) buffer (the public API's open/start/set calls).
 */
#ifndef GDRKV_COMMON_ERRORS_H
#define GDRKV_COMMON_ERRORS_H

#include <stddef.h>

/* Writes the message into err (when there is room) and returns code. */
int gk_error(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
