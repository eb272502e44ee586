/*
 * copy.c - see copy.h.
 *
 * A list is cut into byte ranges of equal size, not into pieces, so a
 * batch of one huge object spreads as well as a batch of many small ones.
 * The calling thread copies ranges of its own list until none is left;
 * helpers only add to it. A job lives on its caller's stack: it leaves
 * c->jobs when its last range is taken, and its caller returns only once
 * no helper still copies one of its ranges.
 */
#include "copy.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/common.h"
#include "common/grow.h"

/* A range smaller than this costs more in wakeups than it saves. */
#define GK_COPY_MIN_SHARE (64u << 10)
/* Pieces a list keeps room for between frames. */
#define GK_COPY_KEEP_PIECES 4096

struct gk_copy_job {
    const struct gk_copy_list *list;
    int shares;             /* byte ranges the list is cut into */
    int next_share;         /* ranges handed out so far */
    int running;            /* helpers copying one of its ranges */
    struct gk_copy_job *next;
};

int gk_copy_add(struct gk_copy_list *l, uint8_t *dst, const uint8_t *src, size_t len)
{
    if (gk_grow(&l->pieces, &l->cap, (size_t)l->count + 1, sizeof *l->pieces, 64) < 0)
        return -1;
    l->pieces[l->count++] = (struct gk_copy_piece){dst, src, len};
    l->bytes += len;
    return 0;
}

void gk_copy_reset(struct gk_copy_list *l)
{
    if (l->cap > GK_COPY_KEEP_PIECES)
        gk_copy_free(l);
    l->count = 0;
    l->bytes = 0;
    l->streamed = 0;
    l->demote_sources = 0;
}

void gk_copy_free(struct gk_copy_list *l)
{
    free(l->pieces);
    *l = (struct gk_copy_list){0};
}

/* memcpy with non-temporal stores for the aligned middle. */
static void copy_streamed(uint8_t *dst, const uint8_t *src, size_t len)
{
#if defined(__SSE2__)
    size_t head = GK_MIN((size_t)(-(uintptr_t)dst & 15), len);
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    for (; len >= 64; len -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    memcpy(dst, src, len);
}

/* Bytes copied between two demotions of what was read: the loads of a
 * block have completed by the time its lines are demoted. */
#define GK_COPY_DEMOTE_BLOCK 4096u

/* CLDEMOTE of every line of [p, p + len). Its encoding is a hint NOP on
 * x86 CPUs that lack it, so it needs no feature test. */
static void demote_lines(const uint8_t *p, size_t len)
{
#if defined(__x86_64__) || defined(__i386__)
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < (uintptr_t)p + len; a += 64)
        __asm__ volatile(".byte 0x0f, 0x1c, 0x00" : : "a"(a));   /* cldemote (%rax) */
#else
    (void)p, (void)len;
#endif
}

static void copy_piece(const struct gk_copy_list *l, uint8_t *dst, const uint8_t *src,
                       size_t len)
{
    while (len) {
        size_t n = l->demote_sources ? GK_MIN(len, (size_t)GK_COPY_DEMOTE_BLOCK) : len;
        if (l->streamed)
            copy_streamed(dst, src, n);
        else
            memcpy(dst, src, n);
        if (l->demote_sources)
            demote_lines(src, n);
        dst += n, src += n, len -= n;
    }
}

/* Streamed stores are weakly ordered: they must all be visible before
 * whatever this copy's end publishes (a commit, an answer, the word). */
static void fence_streamed(const struct gk_copy_list *l)
{
#if defined(__SSE2__)
    if (l->streamed)
        _mm_sfence();
#else
    (void)l;
#endif
}

/* Copies bytes [from, to) of the list's concatenated pieces. */
static void copy_range(const struct gk_copy_list *l, uint64_t from, uint64_t to)
{
    uint64_t at = 0;
    for (uint32_t i = 0; i < l->count && at < to; i++) {
        const struct gk_copy_piece *p = &l->pieces[i];
        uint64_t start = GK_MAX(at, from), end = GK_MIN(at + p->len, to);
        if (start < end)
            copy_piece(l, p->dst + (start - at), p->src + (start - at), (size_t)(end - start));
        at += p->len;
    }
    fence_streamed(l);
}

void gk_copy_publish(uint64_t *word, uint64_t bytes)
{
    __atomic_store_n(word, bytes, __ATOMIC_RELEASE);
}

void gk_copy_run_published(const struct gk_copy_list *l, const uint8_t *base, uint64_t *word,
                           uint64_t publish_bytes)
{
    uint64_t unpublished = 0, in_place = 0;
    for (uint32_t i = 0; i < l->count; i++) {
        const struct gk_copy_piece *p = &l->pieces[i];
        /* A large piece is copied in slices, so that the follower starts
         * on it before its end. */
        for (size_t done = 0; done < p->len;) {
            size_t n = (size_t)GK_MIN((uint64_t)(p->len - done), publish_bytes - unpublished);
            copy_piece(l, p->dst + done, p->src + done, n);
            done += n;
            unpublished += n;
            in_place = (uint64_t)(p->dst + done - base);
            if (unpublished == publish_bytes) {
                fence_streamed(l);
                gk_copy_publish(word, in_place);
                unpublished = 0;
            }
        }
    }
    if (unpublished) {
        fence_streamed(l);
        gk_copy_publish(word, in_place);
    }
}

int gk_copy_follow(const struct gk_copy_list *l, const uint8_t *base, const uint64_t *word,
                   int (*wait)(void *arg, uint64_t have, uint64_t need), void *arg)
{
    uint64_t have = 0;
    int rc = 0;
    for (uint32_t i = 0; i < l->count && !rc; i++) {
        const struct gk_copy_piece *p = &l->pieces[i];
        uint64_t need = (uint64_t)(p->src - base) + p->len;
        /* The word is read again only when what it said last falls short:
         * it is the writer's cache line. */
        while (have < need && !rc) {
            have = __atomic_load_n(word, __ATOMIC_ACQUIRE);
            if (have < need && wait(arg, have, need))
                rc = -1;
        }
        if (!rc)
            copy_piece(l, p->dst, p->src, p->len);
    }
    fence_streamed(l);
    return rc;
}

static void copy_share(const struct gk_copy_job *j, int share)
{
    uint64_t bytes = j->list->bytes;
    copy_range(j->list, bytes * (uint64_t)share / (uint64_t)j->shares,
               bytes * (uint64_t)(share + 1) / (uint64_t)j->shares);
}

/* The next range of j (there is one); j leaves the queue with its last.
 * Called with c->lock held. */
static int take_share(struct gk_copier *c, struct gk_copy_job *j)
{
    int share = j->next_share++;
    if (j->next_share == j->shares) {
        struct gk_copy_job **at = &c->jobs;
        while (*at != j)
            at = &(*at)->next;
        *at = j->next;
    }
    return share;
}

static void *helper_main(void *arg)
{
    struct gk_copier *c = arg;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->stop && !c->jobs)
            pthread_cond_wait(&c->wake, &c->lock);
        if (c->stop)
            break;
        struct gk_copy_job *j = c->jobs;
        int share = take_share(c, j);
        j->running++;
        pthread_mutex_unlock(&c->lock);
        copy_share(j, share);
        pthread_mutex_lock(&c->lock);
        if (--j->running == 0)
            pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int gk_copier_init(struct gk_copier *c, int max_helpers, uint64_t parallel_bytes)
{
    memset(c, 0, sizeof *c);
    c->max_helpers = GK_MIN(GK_MAX(max_helpers, 0), GK_COPY_HELPERS_MAX);
    c->parallel_bytes = parallel_bytes;
    if (pthread_mutex_init(&c->lock, NULL))
        return -1;
    if (pthread_cond_init(&c->wake, NULL)) {
        pthread_mutex_destroy(&c->lock);
        return -1;
    }
    if (pthread_cond_init(&c->done, NULL)) {
        pthread_cond_destroy(&c->wake);
        pthread_mutex_destroy(&c->lock);
        return -1;
    }
    return 0;
}

void gk_copier_destroy(struct gk_copier *c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->nthreads; i++)
        pthread_join(c->threads[i], NULL);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
}

/* One helper per further CPU, up to max_helpers; none on one CPU. */
static void start_helpers(struct gk_copier *c)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = (int)GK_MIN(GK_MAX(cpus - 1, 0L), (long)c->max_helpers);

    c->started = 1;
    while (c->nthreads < want &&
           pthread_create(&c->threads[c->nthreads], NULL, helper_main, c) == 0)
        c->nthreads++;
}

void gk_copy_run(struct gk_copier *c, const struct gk_copy_list *l)
{
    if (l->bytes < c->parallel_bytes || l->bytes < 2 * (uint64_t)GK_COPY_MIN_SHARE) {
        copy_range(l, 0, l->bytes);
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->started)
        start_helpers(c);
    if (c->nthreads == 0) {
        pthread_mutex_unlock(&c->lock);
        copy_range(l, 0, l->bytes);
        return;
    }
    struct gk_copy_job job = {.list = l, .next = c->jobs};
    job.shares = (int)GK_MIN((uint64_t)c->nthreads + 1, l->bytes / GK_COPY_MIN_SHARE);
    c->jobs = &job;
    pthread_cond_broadcast(&c->wake);
    while (job.next_share < job.shares) {
        int share = take_share(c, &job);
        pthread_mutex_unlock(&c->lock);
        copy_share(&job, share);
        pthread_mutex_lock(&c->lock);
    }
    while (job.running > 0)
        pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
}
