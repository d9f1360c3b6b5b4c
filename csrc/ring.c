#define _GNU_SOURCE /* O_PATH */
#include "ring.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

/* What, in a ring's directory, can make its path name another file than the one opened
 * (or nothing): an entry created, deleted or moved (over), an attribute (permission)
 * changed, the directory itself moved or deleted. Writes are not watched: a truncation
 * or growth is seen by fstat on the open file. Only a directory is watched, and not
 * through a symlink (re-pointing it would go unseen). */
#define DIR_EVENTS                                                                         \
    (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF |    \
     IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)

/* Directories with events that one drain tells apart; beyond, it checks every ring. */
#define MAX_CHANGED_DIRS 64

struct reader {
    int fd; /* -1 while closed */
    char *path;
    dev_t dev;
    ino_t ino;
    /* The inotify watch on the path's directory (-1: none, the path is looked up at every
     * drain), and whether the next drain must look the path up (and watch again). */
    int wd;
    int suspect;
    uint64_t read_pos;     /* next position to read */
    uint64_t last_read_ns; /* real clock before the last read of the write counter */
    uint64_t last_now_ns;  /* latest now (given or real, the later): times stalled slots */
    /* A drain stopped at the unpublished slot stalled_pos, at stalled_since_ns, when
     * stalled_span slots from it on were claimed. */
    int stalled;
    uint64_t stalled_pos, stalled_span, stalled_since_ns;
    /* The window: exact count, sum and max, and the histogram (DQ_RING_NBUCKETS counts). */
    uint64_t count, max_ns;
    unsigned __int128 sum_ns;
    uint64_t *hist;
};

struct dq_ring_table {
    size_t n;
    uint64_t capacity;
    uint64_t file_size;
    uint64_t *counters;
    int8_t *status;
    int8_t *last_fault;
    struct dqoes_ring_slot *scratch; /* capacity slots: where pread copies a ring */
    uint64_t *hist;                  /* n * DQ_RING_NBUCKETS */
    struct reader *readers;
    int inotify_fd; /* -1: none, every drain looks up every ring's path */
};

uint64_t dq_ring_file_size(uint64_t capacity) {
    if (capacity < DQOES_RING_MIN_CAPACITY || capacity > DQOES_RING_MAX_CAPACITY ||
        (capacity & (capacity - 1)) != 0)
        return 0;
    return DQOES_RING_HEADER_SIZE + capacity * DQOES_RING_SLOT_SIZE;
}

int dq_ring_format_header(void *buf, uint64_t capacity) {
    struct dqoes_ring_header h;
    if (dq_ring_file_size(capacity) == 0)
        return -1;
    memset(&h, 0, sizeof h);
    h.magic = DQOES_RING_MAGIC;
    h.version = DQOES_RING_VERSION;
    h.header_size = DQOES_RING_HEADER_SIZE;
    h.slot_size = DQOES_RING_SLOT_SIZE;
    h.capacity = capacity;
    memcpy(buf, &h, sizeof h);
    return 0;
}

dq_ring_table *dq_ring_table_new(size_t n, uint64_t capacity, uint64_t *counters,
                                 int8_t *status, int8_t *last_fault) {
    dq_ring_table *t;
    uint64_t file_size = dq_ring_file_size(capacity);
    if (file_size == 0 || (t = calloc(1, sizeof *t)) == NULL)
        return NULL;
    t->n = n;
    t->capacity = capacity;
    t->file_size = file_size;
    t->counters = counters;
    t->status = status;
    t->last_fault = last_fault;
    t->scratch = aligned_alloc(64, capacity * DQOES_RING_SLOT_SIZE);
    t->hist = calloc(n ? n * DQ_RING_NBUCKETS : 1, sizeof *t->hist);
    t->readers = calloc(n ? n : 1, sizeof *t->readers);
    t->inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (t->scratch == NULL || t->hist == NULL || t->readers == NULL) {
        dq_ring_table_free(t);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        t->readers[i].fd = -1;
        t->readers[i].wd = -1;
        t->readers[i].hist = t->hist + i * DQ_RING_NBUCKETS;
        status[i] = DQ_RING_UNUSED;
    }
    return t;
}

/* Removes watch wd. Other rings in that directory shared it: the IN_IGNORED it queues
 * has them watch again at the next drain. */
static void unwatch(dq_ring_table *t, int wd) {
    if (wd >= 0 && t->inotify_fd >= 0)
        inotify_rm_watch(t->inotify_fd, wd);
}

/* Watches the directory that r's path now goes through, in place of r's previous watch.
 * Done before the path is looked up, so that a change is seen either by that lookup or by
 * the watch. No watch (no inotify, the watch limit reached, a directory reached through a
 * symlink): the path is looked up at every drain. */
static void watch(dq_ring_table *t, struct reader *r) {
    char *slash = strrchr(r->path, '/');
    int old = r->wd;
    r->wd = -1;
    if (t->inotify_fd >= 0 && slash == NULL) {
        r->wd = inotify_add_watch(t->inotify_fd, ".", DIR_EVENTS);
    } else if (t->inotify_fd >= 0) {
        char *end = slash == r->path ? slash + 1 : slash, c = *end; /* "/ring": "/" */
        *end = '\0';
        r->wd = inotify_add_watch(t->inotify_fd, r->path, DIR_EVENTS);
        *end = c;
    }
    if (old != r->wd)
        unwatch(t, old);
}

static void close_reader(dq_ring_table *t, struct reader *r) {
    int wd = r->wd;
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    r->wd = -1;
    unwatch(t, wd);
}

void dq_ring_table_free(dq_ring_table *t) {
    if (t == NULL)
        return;
    if (t->inotify_fd >= 0)
        close(t->inotify_fd); /* drops every watch */
    t->inotify_fd = -1;
    for (size_t i = 0; t->readers && i < t->n; i++) {
        close_reader(t, &t->readers[i]);
        free(t->readers[i].path);
    }
    free(t->readers);
    free(t->hist);
    free(t->scratch);
    free(t);
}

/* Sets entry i's status to a fault; from DQ_RING_CLOSED on, the ring is closed. */
static int set_fault(dq_ring_table *t, size_t i, int code) {
    if (code >= DQ_RING_CLOSED)
        close_reader(t, &t->readers[i]);
    t->status[i] = (int8_t)code;
    t->last_fault[i] = (int8_t)code;
    return code;
}

/* A fault found while reading a ring that worked: counted. */
static void fault(dq_ring_table *t, size_t i, int code) {
    t->counters[DQ_RING_FAULTS * t->n + i]++;
    set_fault(t, i, code);
}

static int fault_of_errno(int err) {
    return err == ENOENT || err == ENOTDIR ? DQ_RING_MISSING
           : err == ELOOP                  ? DQ_RING_NOT_REGULAR
                                           : DQ_RING_IO_ERROR;
}

/* Reads the header; returns DQ_RING_OK or the fault. */
static int read_header(const dq_ring_table *t, int fd, struct dqoes_ring_header *h) {
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        return DQ_RING_IO_ERROR;
    if (!dqoes_ring_header_ok(h, t->file_size) || h->capacity != t->capacity)
        return DQ_RING_BAD_HEADER;
    return DQ_RING_OK;
}

/* Opens the ring at r->path: through an O_PATH descriptor, which opens nothing (no FIFO
 * blocks, no device wakes), so that only a regular file is ever opened for reading. */
static int open_ring(const dq_ring_table *t, struct reader *r, struct dqoes_ring_header *h) {
    struct stat st;
    char proc_path[64];
    int fd, code, pfd = open(r->path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return fault_of_errno(errno);
    if (fstat(pfd, &st) != 0) {
        close(pfd);
        return DQ_RING_IO_ERROR;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != t->file_size) {
        close(pfd);
        return S_ISREG(st.st_mode) ? DQ_RING_BAD_SIZE : DQ_RING_NOT_REGULAR;
    }
    snprintf(proc_path, sizeof proc_path, "/proc/self/fd/%d", pfd);
    fd = open(proc_path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    close(pfd);
    if (fd < 0)
        return fault_of_errno(errno);
    if ((code = read_header(t, fd, h)) != DQ_RING_OK) {
        close(fd);
        return code;
    }
    r->fd = fd;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    return DQ_RING_OK;
}

int dq_ring_attach(dq_ring_table *t, size_t i, const char *path, uint64_t now_ns) {
    struct reader *r = &t->readers[i];
    struct dqoes_ring_header h;
    char *copy = strdup(path);
    int code;
    close_reader(t, r);
    free(r->path);
    r->path = copy;
    if (copy == NULL)
        return set_fault(t, i, DQ_RING_IO_ERROR);
    r->last_read_ns = dqoes_probe_now_ns();
    if ((code = open_ring(t, r, &h)) != DQ_RING_OK)
        return set_fault(t, i, code);
    r->suspect = 1; /* the first drain watches the directory, then looks the path up */
    r->read_pos = h.write_counter;
    r->stalled = 0;
    r->last_now_ns = now_ns;
    t->counters[DQ_RING_PRODUCER_DROPPED * t->n + i] = h.dropped;
    t->status[i] = DQ_RING_OK;
    return DQ_RING_OK;
}

int dq_ring_adopt(dq_ring_table *dst, size_t i, dq_ring_table *src, size_t j) {
    struct reader *to = &dst->readers[i], *from = &src->readers[j];
    uint64_t *hist = to->hist;
    int wd = from->wd;
    if (dst->capacity != src->capacity)
        return -1;
    close_reader(dst, to);
    free(to->path);
    from->wd = -1; /* src's watch means nothing in dst */
    unwatch(src, wd);
    *to = *from;
    to->hist = hist;
    to->suspect = 1; /* changes since src last read its events */
    memcpy(hist, from->hist, DQ_RING_NBUCKETS * sizeof *hist);
    for (int k = 0; k < DQ_RING_NCOUNTERS; k++)
        dst->counters[k * dst->n + i] = src->counters[k * src->n + j];
    dst->status[i] = src->status[j];
    dst->last_fault[i] = src->last_fault[j];
    from->fd = -1;
    from->path = NULL;
    src->status[j] = DQ_RING_UNUSED;
    return 0;
}

/* The counter moved backwards or further than any producer could have: start again at
 * the writer's position, without counting the skipped range as records lost. */
static void resync(dq_ring_table *t, size_t i, uint64_t write_pos, uint64_t read_ns) {
    t->readers[i].read_pos = write_pos;
    t->readers[i].last_read_ns = read_ns;
    t->readers[i].stalled = 0;
    fault(t, i, DQ_RING_RESYNCED);
}

static inline unsigned bucket_of(uint64_t v) {
    unsigned e;
    if (v < (1u << DQ_RING_SUB_BITS))
        return (unsigned)v;
    e = 63u - (unsigned)__builtin_clzll(v); /* floor(log2 v) >= DQ_RING_SUB_BITS */
    return ((e - DQ_RING_SUB_BITS + 1) << DQ_RING_SUB_BITS) |
           (unsigned)((v >> (e - DQ_RING_SUB_BITS)) & ((1u << DQ_RING_SUB_BITS) - 1));
}

/* The midpoint of bucket b, in ns. */
static double bucket_value(unsigned b) {
    unsigned e, shift;
    if (b < (1u << DQ_RING_SUB_BITS))
        return b;
    e = (b >> DQ_RING_SUB_BITS) + DQ_RING_SUB_BITS - 1;
    shift = e - DQ_RING_SUB_BITS;
    return (double)(((1ULL << DQ_RING_SUB_BITS) + (b & ((1u << DQ_RING_SUB_BITS) - 1))) << shift) +
           (double)((1ULL << shift) - 1) / 2.0;
}

/* Marks suspect the rings whose directory reported a change since the last drain: every
 * ring after a queue overflow, a failed read or changes in too many directories. */
static void note_changes(dq_ring_table *t) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    const struct inotify_event *ev;
    int changed[MAX_CHANGED_DIRS], all = 0;
    size_t nchanged = 0;
    ssize_t len;
    if (t->inotify_fd < 0)
        return;
    while ((len = read(t->inotify_fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + len; p += sizeof *ev + ev->len) {
            size_t k = 0;
            ev = (const struct inotify_event *)(void *)p;
            while (k < nchanged && changed[k] != ev->wd)
                k++;
            if ((ev->mask & IN_Q_OVERFLOW) || (k == nchanged && nchanged == MAX_CHANGED_DIRS))
                all = 1;
            else if (k == nchanged)
                changed[nchanged++] = ev->wd;
        }
    }
    all |= len < 0 && errno != EAGAIN;
    for (size_t i = 0; (all || nchanged) && i < t->n; i++) {
        struct reader *r = &t->readers[i];
        for (size_t k = 0; k < nchanged; k++)
            r->suspect |= r->wd == changed[k];
        r->suspect |= all;
    }
}

/* Checks that r->path still names the file opened, unchanged in size, and reads its
 * header; returns DQ_RING_OK or the fault. Unless its directory changed (or is not
 * watched), the path still names the file opened: fstat of that file then gives the same
 * answer without a path lookup. */
static int check_file(dq_ring_table *t, struct reader *r, struct dqoes_ring_header *h) {
    struct stat st;
    int lookup = r->suspect || r->wd < 0;
    if (r->suspect)
        watch(t, r);
    r->suspect = 0;
    if ((lookup ? fstatat(AT_FDCWD, r->path, &st, AT_SYMLINK_NOFOLLOW) : fstat(r->fd, &st)) != 0)
        return fault_of_errno(errno);
    if (!S_ISREG(st.st_mode))
        return DQ_RING_NOT_REGULAR;
    if (st.st_dev != r->dev || st.st_ino != r->ino)
        return DQ_RING_REPLACED;
    if ((uint64_t)st.st_size != t->file_size)
        return DQ_RING_BAD_SIZE;
    return read_header(t, r->fd, h);
}

/* Copies the n slots from position pos on (wrapping around) to the start of scratch. */
static int copy_slots(dq_ring_table *t, int fd, uint64_t pos, uint64_t n) {
    uint64_t at = pos & (t->capacity - 1);
    uint64_t first = at + n <= t->capacity ? n : t->capacity - at;
    size_t len1 = first * DQOES_RING_SLOT_SIZE, len2 = (n - first) * DQOES_RING_SLOT_SIZE;
    if (pread(fd, t->scratch, len1, (off_t)(DQOES_RING_HEADER_SIZE + at * DQOES_RING_SLOT_SIZE)) !=
            (ssize_t)len1 ||
        (len2 && pread(fd, t->scratch + first, len2, DQOES_RING_HEADER_SIZE) != (ssize_t)len2))
        return DQ_RING_IO_ERROR;
    return DQ_RING_OK;
}

/* Reads entry i's new slots into its window; returns the number of records accepted.
 * Positions count modulo 2^64: only differences between them are compared. */
static uint64_t drain_one(dq_ring_table *t, size_t i, uint64_t now_ns,
                          struct dq_ring_record *out, uint64_t out_len, uint64_t *captured) {
    struct reader *r = &t->readers[i];
    const uint64_t cap = t->capacity;
    struct dqoes_ring_header h;
    uint64_t write_pos, write_after, start, n, k, ahead, end_limit, read_ns, lost = 0;
    uint64_t accepted = 0, torn = 0, invalid = 0;
    int code;

    /* How far the counter may move: no producer claims more than one slot per nanosecond,
     * timed from before the previous read of the counter to after this one (on the real
     * clock: the reader may be preempted anywhere). A move backwards looks huge. */
    read_ns = dqoes_probe_now_ns();
    if ((code = check_file(t, r, &h)) != DQ_RING_OK) {
        fault(t, i, code);
        return 0;
    }
    t->counters[DQ_RING_PRODUCER_DROPPED * t->n + i] = h.dropped;
    write_pos = h.write_counter;
    start = r->read_pos;
    n = write_pos - start;
    if (n > cap + (dqoes_probe_now_ns() - r->last_read_ns)) {
        resync(t, i, write_pos, read_ns);
        return 0;
    }
    r->last_read_ns = read_ns;
    now_ns = now_ns > read_ns ? now_ns : read_ns;
    r->last_now_ns = now_ns > r->last_now_ns ? now_ns : r->last_now_ns;
    end_limit = now_ns + DQ_RING_END_SLACK_NS;
    t->status[i] = DQ_RING_OK;
    if (n > cap) {
        lost = n - cap;
        start = write_pos - cap;
        n = cap;
    }
    if (n == 0)
        return 0;
    if (copy_slots(t, r->fd, start, n) != DQ_RING_OK) {
        fault(t, i, DQ_RING_IO_ERROR);
        return 0;
    }
    /* The counter read after the copy tells which slots a producer may have been
     * rewriting meanwhile: those a full lap behind it. */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (pread(r->fd, &write_after, sizeof write_after,
              offsetof(struct dqoes_ring_header, write_counter)) != (ssize_t)sizeof write_after) {
        fault(t, i, DQ_RING_IO_ERROR);
        return 0;
    }
    if (write_after - write_pos > cap + (dqoes_probe_now_ns() - read_ns)) {
        resync(t, i, write_after, read_ns);
        return 0;
    }
    ahead = write_after - start;
    k = ahead > cap ? (ahead - cap < n ? ahead - cap : n) : 0;
    lost += k;
    for (; k < n; k++) {
        const struct dqoes_ring_slot *s = &t->scratch[k];
        const uint64_t pos = start + k, lat = s->latency_ns;
        if (s->seq != pos + 1 || s->check != dqoes_ring_check(s->seq, s->end_ns, lat)) {
            /* Not published yet, or torn. Wait for it until the next drain at least
             * DQ_RING_STALL_NS later; then give up on it and on every slot that was
             * already claimed when it was first seen (their producers died or never
             * publish). */
            if (r->stalled && pos - r->stalled_pos < r->stalled_span) {
                if (r->last_now_ns - r->stalled_since_ns < DQ_RING_STALL_NS)
                    break;
                torn++;
                continue;
            }
            r->stalled = 1;
            r->stalled_pos = pos;
            r->stalled_span = write_pos - pos;
            r->stalled_since_ns = r->last_now_ns;
            break;
        }
        if (lat == 0 || lat > DQOES_RING_MAX_LATENCY_NS || s->end_ns > end_limit) {
            invalid++;
            continue;
        }
        r->hist[bucket_of(lat)]++;
        r->count++;
        r->sum_ns += lat;
        r->max_ns = lat > r->max_ns ? lat : r->max_ns;
        if (out != NULL && *captured < out_len) {
            out[*captured] = (struct dq_ring_record){
                .ring = (uint32_t)i, .end_ns = s->end_ns, .latency_ns = lat};
        }
        (*captured)++;
        accepted++;
    }
    r->read_pos = start + k;
    t->counters[DQ_RING_RECORDS * t->n + i] += accepted;
    t->counters[DQ_RING_LOST_OVERRUN * t->n + i] += lost;
    t->counters[DQ_RING_TORN * t->n + i] += torn;
    t->counters[DQ_RING_INVALID * t->n + i] += invalid;
    return accepted;
}

uint64_t dq_ring_drain(dq_ring_table *t, uint64_t now_ns, struct dq_ring_record *out,
                       uint64_t out_len) {
    uint64_t accepted = 0, captured = 0;
    note_changes(t);
    for (size_t i = 0; i < t->n; i++)
        if (t->readers[i].fd >= 0)
            accepted += drain_one(t, i, now_ns, out, out_len, &captured);
    return accepted;
}

void dq_ring_take_window(dq_ring_table *t, int64_t *count, double *stats) {
    static const unsigned percent[] = {50, 90, 95, 99};
    const size_t n = t->n;
    for (size_t i = 0; i < n; i++) {
        struct reader *r = &t->readers[i];
        uint64_t c = r->count, seen = 0;
        unsigned b = 0;
        count[i] = (int64_t)c;
        if (c == 0) {
            for (int k = 0; k < DQ_RING_NSTATS; k++)
                stats[k * n + i] = NAN;
            continue;
        }
        stats[DQ_RING_MEAN * n + i] = (double)r->sum_ns / (double)c / 1e9;
        stats[DQ_RING_MAX * n + i] = (double)r->max_ns / 1e9;
        /* Nearest rank: the smallest value with at least ceil(c * p / 100) records at or
         * below it; never above the exact maximum. */
        for (int q = 0; q < 4; q++) {
            uint64_t rank = (uint64_t)(((unsigned __int128)c * percent[q] + 99) / 100);
            double v, max = (double)r->max_ns;
            while (seen + r->hist[b] < rank)
                seen += r->hist[b++];
            v = bucket_value(b);
            stats[(DQ_RING_P50 + q) * n + i] = (v < max ? v : max) / 1e9;
        }
        memset(r->hist, 0, DQ_RING_NBUCKETS * sizeof *r->hist);
        r->count = r->max_ns = 0;
        r->sum_ns = 0;
    }
}
