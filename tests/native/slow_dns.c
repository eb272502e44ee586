/*
 * slow_dns.c - an LD_PRELOAD shim for tests: getaddrinfo of a name (not a
 * numeric address) takes SLOW_DNS_SECONDS (10) and then fails, as with a
 * DNS server that does not answer. test_timeouts.py builds it with cc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*getaddrinfo_fn)(const char *, const char *, const struct addrinfo *,
                              struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    getaddrinfo_fn real = (getaddrinfo_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    struct addrinfo numeric = hints ? *hints : (struct addrinfo){0};
    numeric.ai_flags |= AI_NUMERICHOST;
    /* Numeric addresses, and lookups that ask for nothing else, never
     * reach a DNS server. */
    if (!node || (hints && (hints->ai_flags & AI_NUMERICHOST)))
        return real(node, service, hints, res);
    if (real(node, service, &numeric, res) == 0)
        return 0;
    const char *seconds = getenv("SLOW_DNS_SECONDS");
    sleep(seconds ? (unsigned)atoi(seconds) : 10);
    return EAI_AGAIN;
}
