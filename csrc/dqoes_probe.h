/* dqoes_probe.h: report request latencies to dqoes-cg (header-only, libc only, C11/C++11).
 *
 * An inference server in a container managed by dqoes-cg records the response time of
 * every request it serves into a shared-memory ring that the daemon drains (ring format
 * version 1, docs/ring-format.md):
 *
 *     struct dqoes_probe *probe = dqoes_probe_open(NULL);  // $DQOES_RING or /run/dqoes/ring
 *     uint64_t start = dqoes_probe_now_ns();
 *     ... serve the request ...
 *     dqoes_probe_record(probe, dqoes_probe_now_ns() - start);
 *     dqoes_probe_close(probe);                            // at exit, after the last record
 *
 * A training job reports its evaluation value (loss, accuracy...) after each step or epoch
 * instead, or as well:
 *
 *     dqoes_probe_progress(probe, loss);
 *
 * A record costs one clock read, one atomic add and four stores: no lock, no system call.
 * Any number of threads (and of processes forked after the open) may record through one
 * handle. Without a valid ring at the path, recording is a no-op; about once a second the
 * probe looks at the path again, so it attaches to a ring that the daemon creates or
 * re-creates after the server started. Compile with gcc or clang (it uses their __atomic
 * builtins, which C11 <stdatomic.h> and C++ <atomic> are built on); under a strict -std=c11,
 * include this header before any system header or define _POSIX_C_SOURCE=200809L.
 */
#ifndef DQOES_PROBE_H
#define DQOES_PROBE_H

#if defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && \
    !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOCK_MONOTONIC
#error "dqoes_probe.h needs POSIX: include it first, or define _POSIX_C_SOURCE=200809L"
#endif

/* ---- Ring format, version 1 (shared with the daemon's reader) ---------------------- */

#define DQOES_RING_MAGIC 0x474E5253454F5144ULL /* the bytes "DQOESRNG" on a little-endian host */
#define DQOES_RING_VERSION 1u
#define DQOES_RING_HEADER_SIZE 256u
#define DQOES_RING_SLOT_SIZE 32u
#define DQOES_RING_MIN_CAPACITY 16u
#define DQOES_RING_MAX_CAPACITY (1u << 24)
#define DQOES_RING_MAX_LATENCY_NS 3600000000000ULL /* one hour: anything longer is nonsense */
#define DQOES_RING_DEFAULT_PATH "/run/dqoes/ring"
#define DQOES_RING_ENV "DQOES_RING"
#define DQOES_PROBE_RECHECK_NS 1000000000ULL /* how often a probe looks at its path again */

/* A slot's end_ns word holds a record kind in its top four bits and a CLOCK_MONOTONIC time
 * (< 2^60 ns, 36 years) below them. Kind 0 is a latency record: its word is the plain end
 * time, as every version-1 producer writes it. Other kinds set the top bit, which makes
 * the time absurdly far ahead for readers that predate them: they count such a record as
 * invalid and go on. */
#define DQOES_RING_KIND_SHIFT 60
#define DQOES_RING_TIME_MASK ((1ULL << DQOES_RING_KIND_SHIFT) - 1)
#define DQOES_RING_KIND_LATENCY 0u
#define DQOES_RING_KIND_PROGRESS 8u /* latency_ns holds the bits of a finite IEEE double */

/* Host byte order. Each group of fields that changes at run time has its own cache line. */
struct dqoes_ring_header {
    uint64_t magic;         /* DQOES_RING_MAGIC */
    uint32_t version;       /* DQOES_RING_VERSION */
    uint32_t header_size;   /* DQOES_RING_HEADER_SIZE: the slots start here */
    uint32_t slot_size;     /* DQOES_RING_SLOT_SIZE */
    uint32_t reserved0;
    uint64_t capacity;      /* slots; a power of two */
    uint8_t reserved1[32];
    uint64_t write_counter; /* offset 64: records claimed so far; slot = counter % capacity */
    uint8_t reserved2[56];
    uint64_t dropped;       /* offset 128: records the producers refused (bad latency) */
    uint8_t reserved3[120];
};

/* Two slots per cache line; a slot never straddles one. */
struct dqoes_ring_slot {
    uint64_t seq;        /* position + 1, stored last (release): the slot is published */
    uint64_t end_ns;     /* the kind, then the CLOCK_MONOTONIC time the request ended */
    uint64_t latency_ns; /* its response time, 0 < latency_ns <= DQOES_RING_MAX_LATENCY_NS;
                          * for a progress record, the value's bits */
    uint64_t check;      /* dqoes_ring_check(seq, end_ns, latency_ns): exposes torn slots */
};

#ifdef __cplusplus
#define DQOES_STATIC_ASSERT static_assert
#else
#define DQOES_STATIC_ASSERT _Static_assert
#endif
DQOES_STATIC_ASSERT(sizeof(struct dqoes_ring_header) == DQOES_RING_HEADER_SIZE, "header size");
DQOES_STATIC_ASSERT(offsetof(struct dqoes_ring_header, write_counter) == 64, "counter line");
DQOES_STATIC_ASSERT(offsetof(struct dqoes_ring_header, dropped) == 128, "dropped line");
DQOES_STATIC_ASSERT(sizeof(struct dqoes_ring_slot) == DQOES_RING_SLOT_SIZE, "slot size");

/* A mix of the three fields: a reader that copied a slot while it was being rewritten
 * (halves of two records) sees a check that does not match. Not a defence against a
 * writer that wants to lie: the reader bounds the values for that. */
static inline uint64_t dqoes_ring_check(uint64_t seq, uint64_t end_ns, uint64_t latency_ns) {
    uint64_t h = (seq * 0x9E3779B97F4A7C15ULL) ^ end_ns;
    h = (h * 0xBF58476D1CE4E5B9ULL) ^ latency_ns;
    h *= 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

/* Whether a header describes a version-1 ring that fills exactly file_size bytes. */
static inline int dqoes_ring_header_ok(const struct dqoes_ring_header *h, uint64_t file_size) {
    uint64_t cap = h->capacity;
    return h->magic == DQOES_RING_MAGIC && h->version == DQOES_RING_VERSION &&
           h->header_size == DQOES_RING_HEADER_SIZE && h->slot_size == DQOES_RING_SLOT_SIZE &&
           cap >= DQOES_RING_MIN_CAPACITY && cap <= DQOES_RING_MAX_CAPACITY &&
           (cap & (cap - 1)) == 0 &&
           file_size == DQOES_RING_HEADER_SIZE + cap * DQOES_RING_SLOT_SIZE;
}

/* ---- Producer ---------------------------------------------------------------------- */

/* One mapping of a ring file. A mapping that the probe replaced stays mapped (other
 * threads may still be writing through it) until dqoes_probe_close. */
struct dqoes_probe_map {
    struct dqoes_ring_header *header;
    struct dqoes_ring_slot *slots;
    uint64_t mask;
    size_t size;
    dev_t dev;
    ino_t ino;
    struct dqoes_probe_map *retired;
};

struct dqoes_probe {
    struct dqoes_probe_map *map; /* atomic; NULL while there is no valid ring */
    uint64_t next_check_ns;      /* atomic; when to look at the path again */
    char *path;
};

static inline uint64_t dqoes_probe_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Maps the ring at path if it is a valid one, else returns NULL. */
static inline struct dqoes_probe_map *dqoes_probe_map_ring(const char *path) {
    struct dqoes_ring_header h;
    struct stat st;
    struct dqoes_probe_map *m;
    void *base;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
        !dqoes_ring_header_ok(&h, (uint64_t)st.st_size)) {
        close(fd);
        return NULL;
    }
    base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return NULL;
    m = (struct dqoes_probe_map *)malloc(sizeof *m);
    if (m == NULL) {
        munmap(base, (size_t)st.st_size);
        return NULL;
    }
    m->header = (struct dqoes_ring_header *)base;
    m->slots = (struct dqoes_ring_slot *)((char *)base + DQOES_RING_HEADER_SIZE);
    m->mask = h.capacity - 1; /* from our own copy: the mapped header may change under us */
    m->size = (size_t)st.st_size;
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    m->retired = NULL;
    return m;
}

/* The slow path, about once a second: if the path now names another valid ring (the
 * daemon created or re-created it), switch to it. One thread does it; the others go on. */
static inline void dqoes_probe_recheck(struct dqoes_probe *p, uint64_t now_ns) {
    uint64_t due = __atomic_load_n(&p->next_check_ns, __ATOMIC_RELAXED);
    struct dqoes_probe_map *old, *fresh;
    struct stat st;
    if (now_ns < due || !__atomic_compare_exchange_n(&p->next_check_ns, &due,
                                                     now_ns + DQOES_PROBE_RECHECK_NS, 0,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    old = __atomic_load_n(&p->map, __ATOMIC_RELAXED);
    if (stat(p->path, &st) != 0 || (old && old->dev == st.st_dev && old->ino == st.st_ino))
        return;
    fresh = dqoes_probe_map_ring(p->path);
    if (fresh == NULL)
        return;
    fresh->retired = old;
    __atomic_store_n(&p->map, fresh, __ATOMIC_RELEASE);
}

/* Opens a probe on the ring at path; NULL or "" means $DQOES_RING, else
 * DQOES_RING_DEFAULT_PATH. Returns a handle even when no ring is there yet (it attaches
 * later); NULL only when out of memory. Every function accepts a NULL handle. */
static inline struct dqoes_probe *dqoes_probe_open(const char *path) {
    struct dqoes_probe *p;
    size_t len;
    if (path == NULL || path[0] == '\0')
        path = getenv(DQOES_RING_ENV);
    if (path == NULL || path[0] == '\0')
        path = DQOES_RING_DEFAULT_PATH;
    len = strlen(path);
    p = (struct dqoes_probe *)malloc(sizeof *p + len + 1);
    if (p == NULL)
        return NULL;
    p->path = (char *)(p + 1);
    memcpy(p->path, path, len + 1);
    p->map = dqoes_probe_map_ring(path);
    p->next_check_ns = dqoes_probe_now_ns() + DQOES_PROBE_RECHECK_NS;
    return p;
}

/* Whether the probe currently writes into a ring (1) or drops its records (0). */
static inline int dqoes_probe_attached(struct dqoes_probe *p) {
    return p != NULL && __atomic_load_n(&p->map, __ATOMIC_ACQUIRE) != NULL;
}

/* The ring the probe writes into, after looking at its path again if that is due; NULL
 * while there is none. */
static inline struct dqoes_probe_map *dqoes_probe_ring(struct dqoes_probe *p, uint64_t now_ns) {
    if (now_ns >= __atomic_load_n(&p->next_check_ns, __ATOMIC_RELAXED))
        dqoes_probe_recheck(p, now_ns);
    return __atomic_load_n(&p->map, __ATOMIC_ACQUIRE);
}

/* Claims the next slot and publishes the record (end word, payload) in it. */
static inline void dqoes_probe_write(struct dqoes_probe_map *m, uint64_t end_word,
                                     uint64_t payload) {
    struct dqoes_ring_slot *s;
    uint64_t pos = __atomic_fetch_add(&m->header->write_counter, 1, __ATOMIC_RELAXED);
    /* The claim becomes visible before any store to the slot: a reader that sees our data
     * also sees the counter that tells it whether the slot was being rewritten. */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    s = &m->slots[pos & m->mask];
    __atomic_store_n(&s->end_ns, end_word, __ATOMIC_RELAXED);
    __atomic_store_n(&s->latency_ns, payload, __ATOMIC_RELAXED);
    __atomic_store_n(&s->check, dqoes_ring_check(pos + 1, end_word, payload), __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
}

/* Records a request that ended at end_ns (from dqoes_probe_now_ns) after latency_ns. A
 * latency of 0 or above DQOES_RING_MAX_LATENCY_NS is not written but counted as dropped. */
static inline void dqoes_probe_record_end(struct dqoes_probe *p, uint64_t end_ns,
                                          uint64_t latency_ns) {
    struct dqoes_probe_map *m;
    if (p == NULL || (m = dqoes_probe_ring(p, end_ns)) == NULL)
        return;
    if (latency_ns == 0 || latency_ns > DQOES_RING_MAX_LATENCY_NS)
        __atomic_fetch_add(&m->header->dropped, 1, __ATOMIC_RELAXED);
    else
        dqoes_probe_write(m, end_ns, latency_ns);
}

/* Records a request that just ended after latency_ns. */
static inline void dqoes_probe_record(struct dqoes_probe *p, uint64_t latency_ns) {
    if (p != NULL)
        dqoes_probe_record_end(p, dqoes_probe_now_ns(), latency_ns);
}

/* Records a training job's evaluation value (its loss, accuracy...) as of at_ns (from
 * dqoes_probe_now_ns). A value that is not finite is not written but counted as dropped. */
static inline void dqoes_probe_progress_at(struct dqoes_probe *p, uint64_t at_ns, double value) {
    struct dqoes_probe_map *m;
    uint64_t bits;
    if (p == NULL || (m = dqoes_probe_ring(p, at_ns)) == NULL)
        return;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL || at_ns > DQOES_RING_TIME_MASK)
        __atomic_fetch_add(&m->header->dropped, 1, __ATOMIC_RELAXED); /* NaN or infinite */
    else
        dqoes_probe_write(m, (uint64_t)DQOES_RING_KIND_PROGRESS << DQOES_RING_KIND_SHIFT | at_ns,
                          bits);
}

/* Records a training job's evaluation value now. */
static inline void dqoes_probe_progress(struct dqoes_probe *p, double value) {
    if (p != NULL)
        dqoes_probe_progress_at(p, dqoes_probe_now_ns(), value);
}

/* Unmaps the ring. No thread may use the handle any more. */
static inline void dqoes_probe_close(struct dqoes_probe *p) {
    struct dqoes_probe_map *m, *next;
    if (p == NULL)
        return;
    for (m = p->map; m != NULL; m = next) {
        next = m->retired;
        munmap(m->header, m->size);
        free(m);
    }
    free(p);
}

#endif /* DQOES_PROBE_H */
