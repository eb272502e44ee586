/*
 * errors.c - text for gdrkv_error codes, and errors with a message.
 */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

#include "gdrkv.h"

const char *gdrkv_strerror(int code)
{
    switch (code) {
    case GDRKV_OK: return "ok";
    case GDRKV_E_NOT_FOUND: return "not found";
    case GDRKV_E_TOO_SMALL: return "destination smaller than the object";
    case GDRKV_E_NO_SPACE: return "no space left in the pool";
    case GDRKV_E_TIMEOUT: return "timed out";
    case GDRKV_E_UNAVAILABLE: return "server unavailable";
    case GDRKV_E_PROTOCOL: return "protocol error";
    case GDRKV_E_INVALID: return "invalid argument";
    case GDRKV_E_TOO_LARGE: return "over a protocol limit";
    case GDRKV_E_BUSY: return "busy";
    case GDRKV_E_UNSUPPORTED: return "unsupported";
    case GDRKV_E_INTERNAL: return "internal error";
    case GDRKV_E_CLOSED: return "closed";
    case GDRKV_E_DENIED: return "denied: authentication missing or failed";
    default: return "unknown error";
    }
}

int gk_error(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
