#define _GNU_SOURCE /* O_PATH, renameat2 */
#include "ring.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What can happen to a ring's file other than through a mapping (producers write through
 * theirs, which raises no event), through whatever link: modified by a system call (a
 * truncation, a growth, a write, a hole punched), an attribute changed (its mode, or its
 * link count: a link made, or the path unlinked or renamed over), moved, deleted. The path
 * cannot name another file without one of these happening to the file mapped. */
#define FILE_EVENTS (IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF)

/* Rings with events that one drain tells apart; beyond, it checks every ring. */
#define MAX_CHANGED 64

/* How many rings ahead a drain asks the processor to fetch a ring's header (and twice as
 * far, its reader). */
#define PREFETCH_AHEAD 4

struct reader {
    const struct dqoes_ring_header *header; /* the read-only mapping; NULL while closed */
    const struct dqoes_ring_slot *slots;
    int fd; /* the file mapped, kept to watch it by descriptor; -1 while closed */
    char *path;
    dev_t dev;
    ino_t ino;
    /* The inotify watch on the file (-1: none, the path is looked up at every drain), and
     * whether the next drain must look the path up (and watch again). */
    int wd;
    int suspect;
    uint64_t read_pos;     /* next position to read */
    uint64_t last_read_ns; /* real clock before the last read of the write counter */
    uint64_t last_now_ns;  /* latest now (given or real, the later): times stalled slots */
    /* A drain stopped at the unpublished slot stalled_pos, at stalled_since_ns, when
     * stalled_span slots from it on were claimed. */
    int stalled;
    uint64_t stalled_pos, stalled_span, stalled_since_ns;
    /* The window's latencies: exact count, sum and max, and the histogram
     * (DQ_RING_NBUCKETS counts, of which lo..hi may be non-zero). */
    uint64_t count, max_ns;
    unsigned __int128 sum_ns;
    unsigned lo, hi;
    uint64_t *hist;
    /* The window's progress records: count, the earliest and the latest. */
    uint64_t progress, first_ns, last_ns;
    double first_value, last_value;
};

struct dq_ring_table {
    size_t n;
    uint64_t capacity;
    uint64_t file_size;
    uint64_t *counters;
    int8_t *status;
    int8_t *last_fault;
    struct dqoes_ring_slot *scratch; /* capacity slots: where a drain copies new slots */
    uint64_t *hist;                  /* n * DQ_RING_NBUCKETS */
    struct reader *readers;
    int inotify_fd;         /* -1: none, every drain looks up every ring's path */
    int inotify_lent;       /* inotify_fd is another table's now (dq_ring_share_inotify) */
    volatile size_t cursor; /* the ring a drain is reading, where a SIGBUS brings it back */
};

/* The SIGBUS guard. While a drain reads a ring's mapping (guard.lo to guard.hi), a SIGBUS
 * in that thread is a page that the container took away (it truncated the file) or that
 * the filesystem cannot back (it punched a hole and the filesystem is full): the handler
 * jumps back to the drain, which closes that ring. Any other SIGBUS is not ours: the
 * handler puts back the one installed before it and lets the fault happen again there (or
 * sends the signal again), so that a fault anywhere else crashes the process as it would
 * have without us, with Python's faulthandler report if that was installed. Drains of all
 * tables take turns: there is one jump buffer. */
static struct {
    pthread_mutex_t lock;
    pthread_t owner; /* the draining thread */
    volatile sig_atomic_t active;
    const char *volatile lo, *volatile hi;
    sigjmp_buf env;
    struct sigaction previous;
    volatile sig_atomic_t chained;
} guard = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    const char *addr = (const char *)info->si_addr;
    struct sigaction fallback;
    (void)context;
    /* si_code <= 0: sent, not a fault; here, by a handler installed above ours after it
     * saw our fault (it gives up the signal and raises it again). */
    if (guard.active && pthread_equal(guard.owner, pthread_self()) &&
        (info->si_code <= 0 || (addr >= guard.lo && addr < guard.hi)))
        siglongjmp(guard.env, 1);
    if (!guard.chained) {
        guard.chained = 1;
        sigaction(sig, &guard.previous, NULL);
    } else { /* the previous handler handed it back to us: end the loop */
        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        sigaction(sig, &fallback, NULL);
    }
    /* A fault happens again when we return, into the handler now in place; a signal that
     * was sent is sent again (it is blocked until we return). */
    if (info->si_code <= 0)
        raise(sig);
}

/* Installs on_sigbus, unless it is the handler in place; the one in place is kept to pass
 * on what is not ours. */
static void guard_install(void)
{
    struct sigaction now, ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO;
    sigemptyset(&ours.sa_mask);
    pthread_mutex_lock(&guard.lock);
    if (sigaction(SIGBUS, NULL, &now) == 0 &&
        !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)) {
        guard.previous = now;
        guard.chained = 0;
        sigaction(SIGBUS, &ours, NULL);
    }
    pthread_mutex_unlock(&guard.lock);
}

/* Guards the reads of r's mapping that follow, until guard_off. */
static inline void guard_on(const struct reader *r, uint64_t size)
{
    guard.lo = (const char *)r->header;
    guard.hi = (const char *)r->header + size;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard.active = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void guard_off(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard.active = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

uint64_t dq_ring_file_size(uint64_t capacity)
{
    if (capacity < DQOES_RING_MIN_CAPACITY || capacity > DQOES_RING_MAX_CAPACITY ||
        (capacity & (capacity - 1)) != 0)
        return 0;
    return DQOES_RING_HEADER_SIZE + capacity * DQOES_RING_SLOT_SIZE;
}

int dq_ring_format_header(void *buf, uint64_t capacity)
{
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

dq_ring_table *dq_ring_table_new(size_t n, uint64_t capacity, uint64_t *counters, int8_t *status,
                                 int8_t *last_fault)
{
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
    guard_install();
    return t;
}

/* Removes watch wd. Other entries on the same file shared it: the IN_IGNORED it queues
 * has them watch again at the next drain. */
static void unwatch(dq_ring_table *t, int wd)
{
    if (wd >= 0 && t->inotify_fd >= 0)
        inotify_rm_watch(t->inotify_fd, wd);
}

/* Watches the file r mapped (by its descriptor: the very file, whatever the path names
 * now), in place of r's previous watch. Done before the path is looked up, so that a change
 * is seen either by that lookup or by the watch. No watch (no inotify, the watch limit
 * reached, the ring's directory reached through a symlink, which could be re-pointed
 * unseen): the path is looked up at every drain. */
static void watch(dq_ring_table *t, struct reader *r)
{
    char fd_path[64], *slash = strrchr(r->path, '/');
    struct stat st;
    int old = r->wd, linked = 0;
    r->wd = -1;
    if (slash != NULL && slash != r->path) {
        *slash = '\0';
        linked = lstat(r->path, &st) != 0 || S_ISLNK(st.st_mode);
        *slash = '/';
    }
    if (t->inotify_fd >= 0 && !linked) {
        snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", r->fd);
        r->wd = inotify_add_watch(t->inotify_fd, fd_path, FILE_EVENTS);
    }
    if (old != r->wd)
        unwatch(t, old);
}

static void close_reader(dq_ring_table *t, struct reader *r)
{
    int wd = r->wd;
    if (r->header != NULL)
        munmap((void *)r->header, t->file_size);
    if (r->fd >= 0)
        close(r->fd);
    r->header = NULL;
    r->slots = NULL;
    r->fd = -1;
    r->wd = -1;
    unwatch(t, wd);
}

void dq_ring_table_free(dq_ring_table *t)
{
    if (t == NULL)
        return;
    if (t->inotify_fd >= 0 && !t->inotify_lent) {
        close(t->inotify_fd); /* drops every watch */
        t->inotify_fd = -1;
    } /* else each ring not adopted drops its own watch from the instance, as it closes */
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
static int set_fault(dq_ring_table *t, size_t i, int code)
{
    if (code >= DQ_RING_CLOSED)
        close_reader(t, &t->readers[i]);
    t->status[i] = (int8_t)code;
    t->last_fault[i] = (int8_t)code;
    return code;
}

/* A fault found while reading a ring that worked: counted. */
static void fault(dq_ring_table *t, size_t i, int code)
{
    t->counters[DQ_RING_FAULTS * t->n + i]++;
    set_fault(t, i, code);
}

static int fault_of_errno(int err)
{
    return err == ENOENT || err == ENOTDIR ? DQ_RING_MISSING
           : err == ELOOP                  ? DQ_RING_NOT_REGULAR
                                           : DQ_RING_IO_ERROR;
}

/* What st says of the file at a ring's path, against the file r mapped (r NULL: none yet):
 * DQ_RING_OK or the fault. A ring must be fully allocated: a page first touched after the
 * filesystem filled up would fault its producers (or the reader). */
static int judge_file(const dq_ring_table *t, const struct reader *r, const struct stat *st)
{
    if (!S_ISREG(st->st_mode))
        return DQ_RING_NOT_REGULAR;
    if (r != NULL && (st->st_dev != r->dev || st->st_ino != r->ino))
        return DQ_RING_REPLACED;
    if ((uint64_t)st->st_size != t->file_size || (uint64_t)st->st_blocks * 512 < t->file_size)
        return DQ_RING_BAD_SIZE;
    return DQ_RING_OK;
}

/* Looks r's path up: DQ_RING_OK if it still names the file mapped, unchanged, else the fault. */
static int look_up(const dq_ring_table *t, const struct reader *r)
{
    struct stat st;
    if (fstatat(AT_FDCWD, r->path, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return fault_of_errno(errno);
    return judge_file(t, r, &st);
}

/* Opens and maps the ring at r->path: through an O_PATH descriptor, which opens nothing
 * (no FIFO blocks, no device wakes), so that only a regular file is ever opened. Its
 * header, as read, goes to h. */
static int open_ring(const dq_ring_table *t, struct reader *r, struct dqoes_ring_header *h)
{
    struct stat st;
    char proc_path[64];
    void *base;
    int fd, code, pfd = open(r->path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return fault_of_errno(errno);
    if (fstat(pfd, &st) != 0) {
        close(pfd);
        return DQ_RING_IO_ERROR;
    }
    if ((code = judge_file(t, NULL, &st)) != DQ_RING_OK) {
        close(pfd);
        return code;
    }
    snprintf(proc_path, sizeof proc_path, "/proc/self/fd/%d", pfd);
    fd = open(proc_path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    close(pfd);
    if (fd < 0)
        return fault_of_errno(errno);
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h) {
        close(fd);
        return DQ_RING_IO_ERROR;
    }
    if (!dqoes_ring_header_ok(h, t->file_size) || h->capacity != t->capacity) {
        close(fd);
        return DQ_RING_BAD_HEADER;
    }
    base = mmap(NULL, t->file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return DQ_RING_IO_ERROR;
    }
    r->fd = fd;
    r->header = (const struct dqoes_ring_header *)base;
    r->slots = (const struct dqoes_ring_slot *)((const char *)base + DQOES_RING_HEADER_SIZE);
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    return DQ_RING_OK;
}

int dq_ring_attach(dq_ring_table *t, size_t i, const char *path, uint64_t now_ns)
{
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

void dq_ring_share_inotify(dq_ring_table *dst, dq_ring_table *src)
{
    if (src->inotify_fd < 0 || src->inotify_lent)
        return;
    if (dst->inotify_fd >= 0 && !dst->inotify_lent)
        close(dst->inotify_fd); /* new: it watches nothing yet */
    dst->inotify_fd = src->inotify_fd;
    dst->inotify_lent = 0;
    src->inotify_lent = 1;
}

int dq_ring_adopt(dq_ring_table *dst, size_t i, dq_ring_table *src, size_t j)
{
    struct reader *to = &dst->readers[i], *from = &src->readers[j];
    uint64_t *hist = to->hist;
    int wd = from->wd;
    if (dst->capacity != src->capacity)
        return -1;
    close_reader(dst, to);
    free(to->path);
    from->wd = -1;
    if (dst->inotify_fd != src->inotify_fd) { /* src's watch means nothing in dst */
        unwatch(src, wd);
        wd = -1;
    }
    *to = *from;
    to->wd = wd;
    to->hist = hist;
    to->suspect = 1; /* changes since src last read its events */
    memcpy(hist, from->hist, DQ_RING_NBUCKETS * sizeof *hist);
    for (int k = 0; k < DQ_RING_NCOUNTERS; k++)
        dst->counters[k * dst->n + i] = src->counters[k * src->n + j];
    dst->status[i] = src->status[j];
    dst->last_fault[i] = src->last_fault[j];
    from->header = NULL; /* the mapping and the file are dst's now */
    from->slots = NULL;
    from->fd = -1;
    from->path = NULL;
    src->status[j] = DQ_RING_UNUSED;
    return 0;
}

/* The counter moved backwards or further than any producer could have: start again at
 * the writer's position, without counting the skipped range as records lost. */
static void resync(dq_ring_table *t, size_t i, uint64_t write_pos, uint64_t read_ns)
{
    t->readers[i].read_pos = write_pos;
    t->readers[i].last_read_ns = read_ns;
    t->readers[i].stalled = 0;
    fault(t, i, DQ_RING_RESYNCED);
}

static inline unsigned bucket_of(uint64_t v)
{
    unsigned e;
    if (v < (1u << DQ_RING_SUB_BITS))
        return (unsigned)v;
    e = 63u - (unsigned)__builtin_clzll(v); /* floor(log2 v) >= DQ_RING_SUB_BITS */
    return ((e - DQ_RING_SUB_BITS + 1) << DQ_RING_SUB_BITS) |
           (unsigned)((v >> (e - DQ_RING_SUB_BITS)) & ((1u << DQ_RING_SUB_BITS) - 1));
}

/* The midpoint of bucket b, in ns. */
static double bucket_value(unsigned b)
{
    unsigned e, shift;
    if (b < (1u << DQ_RING_SUB_BITS))
        return b;
    e = (b >> DQ_RING_SUB_BITS) + DQ_RING_SUB_BITS - 1;
    shift = e - DQ_RING_SUB_BITS;
    return (double)(((1ULL << DQ_RING_SUB_BITS) + (b & ((1u << DQ_RING_SUB_BITS) - 1))) << shift) +
           (double)((1ULL << shift) - 1) / 2.0;
}

/* Marks suspect the rings whose file reported a change since the last drain: every ring
 * after a queue overflow, a failed read or changes to too many files. */
static void note_changes(dq_ring_table *t)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    const struct inotify_event *ev;
    int changed[MAX_CHANGED], all = 0;
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
            if ((ev->mask & IN_Q_OVERFLOW) || (k == nchanged && nchanged == MAX_CHANGED))
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

/* Whether r's path still names the file mapped, unchanged: looked up only if the file
 * reported a change (or is not watched); otherwise nothing can have replaced, truncated
 * or grown it. DQ_RING_OK or the fault. */
static int check_file(dq_ring_table *t, struct reader *r)
{
    if (!r->suspect && r->wd >= 0)
        return DQ_RING_OK;
    if (r->suspect)
        watch(t, r);
    r->suspect = 0;
    return look_up(t, r);
}

/* Copies the n slots from position pos on (wrapping around) to the start of scratch. */
static void copy_slots(dq_ring_table *t, const struct reader *r, uint64_t pos, uint64_t n)
{
    uint64_t at = pos & (t->capacity - 1);
    uint64_t first = at + n <= t->capacity ? n : t->capacity - at;
    memcpy(t->scratch, r->slots + at, first * DQOES_RING_SLOT_SIZE);
    if (n > first)
        memcpy(t->scratch + first, r->slots, (n - first) * DQOES_RING_SLOT_SIZE);
}

static void add_latency(struct reader *r, uint64_t lat)
{
    unsigned b = bucket_of(lat);
    r->lo = r->count == 0 || b < r->lo ? b : r->lo;
    r->hi = r->count == 0 || b > r->hi ? b : r->hi;
    r->hist[b]++;
    r->count++;
    r->sum_ns += lat;
    r->max_ns = lat > r->max_ns ? lat : r->max_ns;
}

static void add_progress(struct reader *r, uint64_t at_ns, double value)
{
    if (r->progress == 0 || at_ns < r->first_ns) {
        r->first_ns = at_ns;
        r->first_value = value;
    }
    if (r->progress == 0 || at_ns >= r->last_ns) {
        r->last_ns = at_ns;
        r->last_value = value;
    }
    r->progress++;
}

/* Reads entry i's new slots into its window; returns the number of latency records
 * accepted.
 * Positions count modulo 2^64: only differences between them are compared. Every read of
 * the mapping comes before any change to the entry, so that a SIGBUS on the way (which
 * leaves this function for good) loses nothing but this drain of this ring. */
static uint64_t drain_one(dq_ring_table *t, size_t i, uint64_t now_ns, uint64_t read_ns,
                          struct dq_ring_record *out, uint64_t out_len, uint64_t *captured)
{
    struct reader *r = &t->readers[i];
    const struct dqoes_ring_header *h = r->header;
    const uint64_t cap = t->capacity;
    uint64_t write_pos, write_after, start, n, k, ahead, end_limit, dropped, lost = 0;
    uint64_t accepted = 0, progress = 0, torn = 0, invalid = 0;
    int code;

    /* How far the counter may move: no producer claims more than one slot per nanosecond,
     * timed from before the previous read of the counter (read_ns: the real clock at the
     * start of the drain) to after this one (the reader may be preempted anywhere; the
     * clock is read again only when the move is more than a lap). A move backwards looks
     * huge. */
    if ((code = check_file(t, r)) != DQ_RING_OK) {
        fault(t, i, code);
        return 0;
    }
    guard_on(r, t->file_size);
    if (!dqoes_ring_header_ok(h, t->file_size) || h->capacity != cap) {
        guard_off();
        fault(t, i, DQ_RING_BAD_HEADER);
        return 0;
    }
    dropped = __atomic_load_n(&h->dropped, __ATOMIC_RELAXED);
    write_pos = __atomic_load_n(&h->write_counter, __ATOMIC_ACQUIRE);
    start = r->read_pos;
    n = write_pos - start;
    if (n == 0) { /* nothing new: the common case, a few loads */
        guard_off();
        t->counters[DQ_RING_PRODUCER_DROPPED * t->n + i] = dropped;
        t->status[i] = DQ_RING_OK;
        r->last_read_ns = read_ns;
        return 0;
    }
    if (n > cap && n - cap > dqoes_probe_now_ns() - r->last_read_ns) {
        guard_off();
        t->counters[DQ_RING_PRODUCER_DROPPED * t->n + i] = dropped;
        resync(t, i, write_pos, read_ns);
        return 0;
    }
    if (n > cap) {
        lost = n - cap;
        start = write_pos - cap;
        n = cap;
    }
    copy_slots(t, r, start, n);
    /* The counter read after the copy tells which slots a producer may have been
     * rewriting meanwhile: those a full lap behind it. */
    write_after = __atomic_load_n(&h->write_counter, __ATOMIC_ACQUIRE);
    guard_off();

    t->counters[DQ_RING_PRODUCER_DROPPED * t->n + i] = dropped;
    if (write_after - write_pos > cap &&
        write_after - write_pos - cap > dqoes_probe_now_ns() - read_ns) {
        resync(t, i, write_after, read_ns);
        return 0;
    }
    r->last_read_ns = read_ns;
    now_ns = now_ns > read_ns ? now_ns : read_ns;
    r->last_now_ns = now_ns > r->last_now_ns ? now_ns : r->last_now_ns;
    end_limit = now_ns + DQ_RING_END_SLACK_NS;
    t->status[i] = DQ_RING_OK;
    ahead = write_after - start;
    k = ahead > cap ? (ahead - cap < n ? ahead - cap : n) : 0;
    lost += k;
    for (; k < n; k++) {
        const struct dqoes_ring_slot *s = &t->scratch[k];
        const uint64_t pos = start + k, word = s->end_ns, payload = s->latency_ns;
        const uint64_t at = word & DQOES_RING_TIME_MASK;
        const unsigned kind = (unsigned)(word >> DQOES_RING_KIND_SHIFT);
        double value;
        if (s->seq != pos + 1 || s->check != dqoes_ring_check(s->seq, word, payload)) {
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
        memcpy(&value, &payload, sizeof value);
        if (at > end_limit) {
            invalid++;
        } else if (kind == DQOES_RING_KIND_LATENCY && payload != 0 &&
                   payload <= DQOES_RING_MAX_LATENCY_NS) {
            add_latency(r, payload);
            if (out != NULL && *captured < out_len)
                out[*captured] = (struct dq_ring_record){
                    .ring = (uint32_t)i, .end_ns = at, .latency_ns = payload};
            (*captured)++;
            accepted++;
        } else if (kind == DQOES_RING_KIND_PROGRESS && isfinite(value)) {
            add_progress(r, at, value);
            progress++;
        } else {
            invalid++;
        }
    }
    r->read_pos = start + k;
    t->counters[DQ_RING_RECORDS * t->n + i] += accepted;
    t->counters[DQ_RING_PROGRESS * t->n + i] += progress;
    t->counters[DQ_RING_LOST_OVERRUN * t->n + i] += lost;
    t->counters[DQ_RING_TORN * t->n + i] += torn;
    t->counters[DQ_RING_INVALID * t->n + i] += invalid;
    return accepted;
}

uint64_t dq_ring_drain(dq_ring_table *t, uint64_t now_ns, struct dq_ring_record *out,
                       uint64_t out_len)
{
    volatile uint64_t accepted = 0, captured = 0; /* kept across a jump back */
    const uint64_t read_ns = dqoes_probe_now_ns();
    sigset_t sigbus;
    note_changes(t);
    pthread_mutex_lock(&guard.lock);
    guard.owner = pthread_self();
    t->cursor = 0;
    if (sigsetjmp(guard.env, 0) != 0) { /* (no signal mask saved: that is a system call) */
        guard_off();
        sigemptyset(&sigbus);
        sigaddset(&sigbus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &sigbus, NULL); /* blocked in the handler we left */
        /* Truncated (the usual case) or not backed: the path tells which. */
        fault(t, t->cursor,
              look_up(t, &t->readers[t->cursor]) == DQ_RING_OK ? DQ_RING_IO_ERROR
                                                               : DQ_RING_BAD_SIZE);
        t->cursor++;
    }
    for (size_t i; (i = t->cursor) < t->n; t->cursor = i + 1) {
        uint64_t c = captured;
        /* Each ring is a few cache misses in its own pages, which nothing makes the
         * processor fetch ahead: ask for the rings a little further on meanwhile. */
        if (i + 2 * PREFETCH_AHEAD < t->n)
            __builtin_prefetch(&t->readers[i + 2 * PREFETCH_AHEAD]);
        if (i + PREFETCH_AHEAD < t->n && t->readers[i + PREFETCH_AHEAD].header != NULL) {
            const struct reader *next = &t->readers[i + PREFETCH_AHEAD];
            __builtin_prefetch(next->header);
            /* where its new latencies most likely go: the histogram's first bucket in use
             * (each ring's histogram is pages of its own, a TLB miss when not asked ahead) */
            __builtin_prefetch(&next->hist[next->lo]);
        }
        if (t->readers[i].header == NULL)
            continue;
        accepted += drain_one(t, i, now_ns, read_ns, out, out_len, &c);
        captured = c;
    }
    pthread_mutex_unlock(&guard.lock);
    return accepted;
}

void dq_ring_take_window(dq_ring_table *t, int64_t *count, double *stats, int64_t *progress,
                         double *progress_value, uint64_t *progress_ns)
{
    static const unsigned percent[] = {50, 90, 95, 99};
    const size_t n = t->n;
    for (size_t i = 0; i < n; i++) {
        struct reader *r = &t->readers[i];
        uint64_t c = r->count, seen = 0;
        if (i + PREFETCH_AHEAD < n) /* as in dq_ring_drain: the histogram's pages */
            __builtin_prefetch(&r[PREFETCH_AHEAD].hist[r[PREFETCH_AHEAD].lo]);
        unsigned b = r->lo;
        int some = r->progress != 0;
        progress[i] = (int64_t)r->progress;
        progress_value[DQ_RING_FIRST * n + i] = some ? r->first_value : NAN;
        progress_value[DQ_RING_LAST * n + i] = some ? r->last_value : NAN;
        progress_ns[DQ_RING_FIRST * n + i] = some ? r->first_ns : 0;
        progress_ns[DQ_RING_LAST * n + i] = some ? r->last_ns : 0;
        r->progress = 0;
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
        memset(r->hist + r->lo, 0, (r->hi - r->lo + 1) * sizeof *r->hist);
        r->count = r->max_ns = 0;
        r->sum_ns = 0;
    }
}

static int is_dot(const char *name)
{
    return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

/* Empties directory name (in junk) as far as *spent < budget allows: its files, symlinks
 * and FIFOs are removed there, its directories moved up into junk under fresh names
 * (never over an existing entry), so that no walk goes deeper than one level. One unit of
 * budget per entry, or one for a directory that cannot be opened. Returns how many
 * entries were removed or moved. */
static unsigned empty_into(int junk, const char *name, unsigned budget, unsigned *spent)
{
    static uint64_t serial;
    struct dirent *e;
    unsigned done = 0;
    DIR *d = NULL;
    int fd = openat(junk, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 || (d = fdopendir(fd)) == NULL) {
        if (fd >= 0)
            close(fd);
        (*spent)++;
        return 0;
    }
    while (*spent < budget && (e = readdir(d)) != NULL) {
        char to[32];
        if (is_dot(e->d_name))
            continue;
        (*spent)++;
        if (e->d_type != DT_DIR && unlinkat(fd, e->d_name, 0) == 0) {
            done++;
            continue;
        }
        snprintf(to, sizeof to, "h%llx",
                 (unsigned long long)__atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
        done += renameat2(fd, e->d_name, junk, to, RENAME_NOREPLACE) == 0;
    }
    closedir(d);
    return done;
}

int dq_ring_sweep(const char *dir, unsigned budget)
{
    unsigned spent = 0, done = 0, done_before = 0;
    struct dirent *e;
    int seen = 0, junk, dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d;
    if (dirfd < 0)
        return 0;
    junk = openat(dirfd, DQ_RING_JUNK_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (junk < 0 || (d = fdopendir(junk)) == NULL) {
        if (junk >= 0)
            close(junk);
        close(dirfd);
        return 0;
    }
    while (spent < budget) {
        if ((e = readdir(d)) == NULL) {
            /* Entries moved up may come after the end: read again, if this pass did
             * something and found something. */
            if (!seen || done == done_before)
                break;
            rewinddir(d);
            done_before = done;
            seen = 0;
            continue;
        }
        if (is_dot(e->d_name))
            continue;
        seen = 1;
        spent++;
        if ((e->d_type != DT_DIR && unlinkat(junk, e->d_name, 0) == 0) ||
            unlinkat(junk, e->d_name, AT_REMOVEDIR) == 0)
            done++;
        else if (errno == ENOTEMPTY || errno == EEXIST)
            done += empty_into(junk, e->d_name, budget, &spent);
    }
    closedir(d);
    if (!seen) /* a whole pass found it empty */
        unlinkat(dirfd, DQ_RING_JUNK_DIR, AT_REMOVEDIR);
    close(dirfd);
    return seen && done;
}
