/* A table of cgroup v2 directories: see cgtable.h.
 *
 * The files are kernel-generated, but the daemon runs as root beside untrusted containers,
 * so everything read is parsed strictly by hand into bounded buffers, nothing is opened
 * through a symlink, and a file that is not a regular file (a FIFO that would block) is
 * refused at open.
 *
 * Each operation does its I/O a batch of entries at a time: one io_uring submission per batch
 * (one system call for up to BATCH_MAX files) where the kernel allows io_uring, else one
 * pread or pwrite per file. Only that step differs; parsing is the same either way.
 */
#define _GNU_SOURCE
#include "cgtable.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* cpu.stat is about 250 bytes on current kernels; a full buffer means we may have lost
 * its end, which is reported as malformed rather than parsed. */
#define STAT_BUF 4096
#define MAX_BUF  64
#define PSI_BUF  512 /* two lines of about 70 bytes */
/* Entries per submission: the batch buffers take BATCH_MAX * STAT_BUF bytes (4 MiB). */
#define BATCH_MAX 1024

/* The files of an entry. cpu.pressure is optional: absent on kernels without pressure
 * stall information. */
enum { STAT, MAX, PSI, NFILES };

struct dq_cgentry {
    int fd[NFILES]; /* >= 0: open descriptor; < 0: -errno of the failed open */
    int err;        /* errno behind the last non-OK status */
};

struct dq_cgtable {
    size_t n;
    size_t batch; /* entries per batch: min(n, BATCH_MAX) */
    int uring;    /* 1: the ring is set up and used */
    struct io_uring ring;
    /* Per slot k of a batch (entry lo + k): STAT_BUF bytes of buf, the bytes to read or
     * write (0: no I/O), what the I/O did (bytes, or -errno), an operation's outcome. */
    char *buf;
    size_t *len;
    ssize_t *res;
    int *err;
    struct dq_cgentry e[];
};

/* Opens path relative to dirfd without following any symlink. openat2 also refuses
 * symlinks in the middle of the path and ".." escapes; where the kernel or a seccomp
 * filter lacks it, O_NOFOLLOW still guards the last component. */
static int open_nofollow(int dirfd, const char *path, int flags)
{
    static int no_openat2;

    flags |= O_CLOEXEC;
    if (!no_openat2) {
        struct open_how how = {
            .flags = (uint64_t)flags,
            .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
                       (dirfd == AT_FDCWD ? 0 : RESOLVE_BENEATH),
        };
        int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
            return fd;
        no_openat2 = 1;
    }
    return openat(dirfd, path, flags | O_NOFOLLOW);
}

/* Returns a descriptor to the regular file dirfd/name, or -errno. O_NONBLOCK only while
 * opening (a FIFO must not block the open): io_uring fails a read of an O_NONBLOCK file
 * that cannot be read without blocking (kernfs, on some kernels) instead of waiting. */
static int open_file(int dirfd, const char *name, int flags)
{
    struct stat st;
    int fd = open_nofollow(dirfd, name, flags | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    int err = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (!err && fcntl(fd, F_SETFL, flags) != 0)
        err = errno;
    if (err) {
        close(fd);
        return -err;
    }
    return fd;
}

static void open_entry(struct dq_cgentry *e, const char *dir)
{
    static const char *const names[NFILES] = {"cpu.stat", "cpu.max", "cpu.pressure"};
    static const int flags[NFILES] = {O_RDONLY, O_RDWR, O_RDONLY};
    int dirfd = open_nofollow(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY);
    int dir_err = dirfd < 0 ? errno : 0;

    for (int f = 0; f < NFILES; f++)
        e->fd[f] = dirfd < 0 ? -dir_err : open_file(dirfd, names[f], flags[f]);
    e->err = e->fd[STAT] < 0 ? -e->fd[STAT] : e->fd[MAX] < 0 ? -e->fd[MAX] : 0;
    if (dirfd >= 0)
        close(dirfd);
}

/* An entry without open files: one to be adopted, or given away */
static const struct dq_cgentry closed = {.fd = {-EBADF, -EBADF, -EBADF}, .err = EBADF};

static void close_entry(struct dq_cgentry *e)
{
    for (int f = 0; f < NFILES; f++)
        if (e->fd[f] >= 0)
            close(e->fd[f]);
    *e = closed;
}

static void free_table(dq_cgtable *t)
{
    free(t->buf);
    free(t->len);
    free(t->res);
    free(t->err);
    free(t);
}

void dq_cgtable_close(dq_cgtable *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        close_entry(&t->e[i]);
    if (t->uring)
        io_uring_queue_exit(&t->ring);
    free_table(t);
}

dq_cgtable *dq_cgtable_open(const char *const *dirs, size_t n)
{
    if (n > (SIZE_MAX - sizeof(dq_cgtable)) / sizeof(struct dq_cgentry))
        return NULL;
    dq_cgtable *t = calloc(1, sizeof *t + n * sizeof t->e[0]);
    if (!t)
        return NULL;
    t->n = n;
    t->batch = n < BATCH_MAX ? n : BATCH_MAX;
    size_t slots = t->batch ? t->batch : 1;
    t->buf = malloc(slots * STAT_BUF);
    t->len = malloc(slots * sizeof t->len[0]);
    t->res = malloc(slots * sizeof t->res[0]);
    t->err = malloc(slots * sizeof t->err[0]);
    if (!t->buf || !t->len || !t->res || !t->err) {
        free_table(t);
        return NULL;
    }
    /* Without io_uring (an old kernel, a seccomp filter, io_uring_disabled, or
     * DQOES_NO_IO_URING set to test that path), every file gets a system call of its own. */
    const char *off = getenv("DQOES_NO_IO_URING");
    t->uring =
        t->batch > 0 && !(off && *off) && io_uring_queue_init((unsigned)t->batch, &t->ring, 0) == 0;
    for (size_t i = 0; i < n; i++) {
        if (dirs[i])
            open_entry(&t->e[i], dirs[i]);
        else
            t->e[i] = closed;
    }
    return t;
}

int dq_cgtable_adopt(dq_cgtable *dst, size_t i, dq_cgtable *src, size_t j)
{
    if (i >= dst->n || j >= src->n)
        return -1;
    close_entry(&dst->e[i]);
    dst->e[i] = src->e[j];
    src->e[j] = closed;
    return 0;
}

int dq_cgtable_batched(const dq_cgtable *t)
{
    return t->uring;
}

/* The status of an outcome. A cgroup removed under an open descriptor answers ENODEV. */
static int32_t status_of(int err)
{
    switch (err) {
    case 0:
        return DQ_CG_OK;
    case ENOENT:
    case ENODEV:
    case ESTALE:
        return DQ_CG_GONE;
    case EBADMSG:
        return DQ_CG_MALFORMED;
    default:
        return DQ_CG_ERROR;
    }
}

/* Records err as the entry's outcome and returns the matching status. */
static int32_t settle(struct dq_cgentry *e, int err)
{
    e->err = err;
    return status_of(err);
}

static char *slot(const dq_cgtable *t, size_t k)
{
    return t->buf + k * STAT_BUF;
}

/* Queues the I/O of every slot with something to transfer and submits it with one system
 * call (io_uring_submit_and_wait) per batch, taking the outcomes into res. A file that
 * would not say at once (EINTR, EAGAIN) is left to the caller, as is everything if the
 * ring itself fails (not expected once set up): then the table stops using it. */
static void transfer_batched(dq_cgtable *t, size_t lo, size_t count, int file, int write)
{
    unsigned queued = 0, done = 0;

    for (size_t k = 0; k < count; k++) {
        if (!t->len[k])
            continue;
        /* never NULL: the ring has a batch of entries, all free between operations */
        struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
        int fd = t->e[lo + k].fd[file];
        if (write)
            io_uring_prep_write(sqe, fd, slot(t, k), (unsigned)t->len[k], 0);
        else
            io_uring_prep_read(sqe, fd, slot(t, k), (unsigned)t->len[k], 0);
        io_uring_sqe_set_data64(sqe, k);
        queued++;
    }
    while (done < queued) {
        int r = io_uring_submit_and_wait(&t->ring, queued - done);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
            io_uring_queue_exit(&t->ring);
            t->uring = 0;
            return;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&t->ring, head, cqe)
        {
            int res = cqe->res;
            t->res[io_uring_cqe_get_data64(cqe)] =
                res == -EINTR || res == -EAGAIN ? -EINPROGRESS : res;
            seen++;
        }
        io_uring_cq_advance(&t->ring, seen);
        done += seen;
    }
}

/* Reads (write: writes) `file` of entries lo .. lo + count - 1 at offset 0, slot k holding
 * the len[k] bytes to write or receiving up to len[k] bytes read; a slot whose len is 0 is
 * left alone. res[k] becomes the bytes transferred, or -errno; a read that fills len[k]
 * bytes may have lost the file's end, and is -EBADMSG (malformed). */
static void transfer(dq_cgtable *t, size_t lo, size_t count, int file, int write)
{
    for (size_t k = 0; k < count; k++)
        t->res[k] = -EINPROGRESS;
    if (t->uring)
        transfer_batched(t, lo, count, file, write);
    /* What the ring did not do: one system call each */
    for (size_t k = 0; k < count; k++) {
        int fd = t->e[lo + k].fd[file];
        ssize_t n;
        if (!t->len[k] || t->res[k] != -EINPROGRESS)
            continue;
        do
            n = write ? pwrite(fd, slot(t, k), t->len[k], 0) : pread(fd, slot(t, k), t->len[k], 0);
        while (n < 0 && errno == EINTR);
        t->res[k] = n < 0 ? -errno : n;
    }
    for (size_t k = 0; !write && k < count; k++)
        if (t->len[k] && t->res[k] >= 0 && (size_t)t->res[k] >= t->len[k])
            t->res[k] = -EBADMSG;
}

/* The number of entries in the batch at lo. */
static size_t batch_at(const dq_cgtable *t, size_t lo)
{
    return t->n - lo < t->batch ? t->n - lo : t->batch;
}

/* Reads `file` (up to cap bytes) of the entries of the batch at lo into their slots: res[k]
 * as transfer leaves it, or the failed open's -errno. Returns the batch's size. */
static size_t read_batch(dq_cgtable *t, size_t lo, int file, size_t cap)
{
    size_t count = batch_at(t, lo);

    for (size_t k = 0; k < count; k++)
        t->len[k] = t->e[lo + k].fd[file] < 0 ? 0 : cap;
    transfer(t, lo, count, file, 0);
    for (size_t k = 0; k < count; k++)
        if (t->e[lo + k].fd[file] < 0)
            t->res[k] = t->e[lo + k].fd[file];
    return count;
}

/* Parses the decimal digits at p (at least one, no sign) that fit in a uint64_t.
 * Returns the first byte after them, or NULL. */
static const char *parse_u64(const char *p, const char *end, uint64_t *out)
{
    const char *start = p;
    uint64_t v = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return NULL;
        v = v * 10 + digit;
    }
    if (p == start)
        return NULL;
    *out = v;
    return p;
}

enum { USAGE, THROTTLED, PERIODS, NR_THROTTLED, NKEYS };

static const struct {
    const char *name;
    size_t len;
} stat_keys[NKEYS] = {
    [USAGE] = {"usage_usec", 10},
    [THROTTLED] = {"throttled_usec", 14},
    [PERIODS] = {"nr_periods", 10},
    [NR_THROTTLED] = {"nr_throttled", 12},
};

/* Parses "key value\n" lines in any order. Unknown keys are skipped; each known key must
 * appear exactly once with a plain decimal value. Returns 0 or EBADMSG. */
static int parse_cpu_stat(const char *buf, size_t len, uint64_t out[NKEYS])
{
    const char *p = buf, *end = buf + len;
    unsigned seen = 0;

    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *space = memchr(p, ' ', (size_t)(eol - p));
        if (!space)
            return EBADMSG;
        for (int k = 0; k < NKEYS; k++) {
            if ((size_t)(space - p) != stat_keys[k].len ||
                memcmp(p, stat_keys[k].name, stat_keys[k].len) != 0)
                continue;
            if (seen & (1u << k) || parse_u64(space + 1, eol, &out[k]) != eol)
                return EBADMSG;
            seen |= 1u << k;
        }
        p = eol == end ? end : eol + 1;
    }
    return seen == (1u << NKEYS) - 1 ? 0 : EBADMSG;
}

/* Parses "max <period>" or "<quota> <period>", the single line the kernel writes; what
 * follows that line is ignored. Returns 0 or EBADMSG. */
static int parse_cpu_max(const char *buf, size_t len, int64_t *quota, int64_t *period)
{
    const char *end = memchr(buf, '\n', len);
    const char *p = buf;
    uint64_t q = 0, per = 0;

    if (!end)
        end = buf + len;
    if (end - p >= 3 && memcmp(p, "max", 3) == 0) {
        q = UINT64_MAX;
        p += 3;
    } else if (!(p = parse_u64(p, end, &q)) || q > INT64_MAX) {
        return EBADMSG;
    }
    if (p == end || *p != ' ')
        return EBADMSG;
    if (parse_u64(p + 1, end, &per) != end || per == 0 || per > INT64_MAX)
        return EBADMSG;
    *quota = q == UINT64_MAX ? -1 : (int64_t)q;
    *period = (int64_t)per;
    return 0;
}

size_t dq_cgtable_sample(dq_cgtable *t, uint64_t *usage_usec, uint64_t *throttled_usec,
                         uint64_t *nr_periods, uint64_t *nr_throttled, int32_t *status)
{
    size_t ok = 0;

    for (size_t lo = 0; lo < t->n; lo += t->batch) {
        size_t count = read_batch(t, lo, STAT, STAT_BUF);
        for (size_t k = 0, i = lo; k < count; k++, i++) {
            uint64_t v[NKEYS] = {0};
            ssize_t n = t->res[k];
            int err = n < 0 ? (int)-n : parse_cpu_stat(slot(t, k), (size_t)n, v);
            status[i] = settle(&t->e[i], err);
            if (err)
                continue;
            usage_usec[i] = v[USAGE];
            throttled_usec[i] = v[THROTTLED];
            nr_periods[i] = v[PERIODS];
            nr_throttled[i] = v[NR_THROTTLED];
            ok++;
        }
    }
    return ok;
}

/* Formats one cpu.max value into buf (MAX_BUF bytes). Returns its length, or 0. */
static size_t format_cpu_max(char *buf, int64_t quota, int64_t period)
{
    int len = quota < 0 ? snprintf(buf, MAX_BUF, "max %" PRId64 "\n", period)
                        : snprintf(buf, MAX_BUF, "%" PRId64 " %" PRId64 "\n", quota, period);
    return len > 0 && len < MAX_BUF ? (size_t)len : 0;
}

/* Whether cpu.max as read into slot k (res[k]: its length or -errno) holds (quota,
 * period): 1 if it does, 0 if it holds anything else (stored in *found_quota,
 * *found_period), -1 if it could not be read. */
static int holds(const dq_cgtable *t, size_t k, int64_t quota, int64_t period, int64_t *found_quota,
                 int64_t *found_period)
{
    int64_t q, p;
    if (t->res[k] < 0 || parse_cpu_max(slot(t, k), (size_t)t->res[k], &q, &p) != 0)
        return -1;
    *found_quota = q;
    *found_period = p;
    return q == quota && p == period;
}

/* An outcome of apply's first pass: the entry is left alone, or to be written */
#define SKIP  (-1)
#define WRITE (-2)

static int64_t quota_of(const int64_t *quota_usec, size_t i)
{
    return quota_usec[i] < 0 ? -1 : quota_usec[i]; /* any negative quota is "max" */
}

size_t dq_cgtable_apply(dq_cgtable *t, const int64_t *quota_usec, const int64_t *period_usec,
                        int64_t *last_quota_usec, int64_t *last_period_usec, int32_t *status,
                        uint8_t *foreign, int64_t *found_quota_usec, int64_t *found_period_usec)
{
    size_t written = 0;

    for (size_t lo = 0; lo < t->n; lo += t->batch) {
        size_t count = batch_at(t, lo);

        /* Which entries to write, and of those, which to read first: the ones holding a
         * known value of ours */
        for (size_t k = 0, i = lo; k < count; k++, i++) {
            int64_t period = period_usec[i];
            int fd = t->e[i].fd[MAX];

            t->len[k] = 0;
            if (period == 0) { /* the caller leaves this cgroup's limit alone */
                t->err[k] = SKIP;
            } else if (fd < 0) {
                t->err[k] = -fd;
            } else if (period < 0) {
                t->err[k] = EINVAL;
            } else if (quota_of(quota_usec, i) == last_quota_usec[i] &&
                       period == last_period_usec[i]) {
                t->err[k] = 0;
            } else {
                t->err[k] = WRITE;
                t->len[k] = last_period_usec[i] != 0 ? MAX_BUF : 0;
            }
        }
        transfer(t, lo, count, MAX, 0);

        /* Someone else's value in place of ours is a foreign write, even when ours is about
         * to replace it: the reconcile would never see it. */
        for (size_t k = 0, i = lo; k < count; k++, i++) {
            if (t->err[k] != WRITE)
                continue;
            foreign[i] = t->len[k] && holds(t, k, last_quota_usec[i], last_period_usec[i],
                                            &found_quota_usec[i], &found_period_usec[i]) == 0;
            t->len[k] = format_cpu_max(slot(t, k), quota_of(quota_usec, i), period_usec[i]);
            if (!t->len[k])
                t->err[k] = EINVAL;
        }
        transfer(t, lo, count, MAX, 1);

        for (size_t k = 0, i = lo; k < count; k++, i++) {
            if (t->err[k] == SKIP)
                continue;
            if (t->err[k] == WRITE) {
                ssize_t n = t->res[k];
                t->err[k] = n < 0 ? (int)-n : (size_t)n == t->len[k] ? 0 : EIO;
                if (t->err[k] == 0) {
                    last_quota_usec[i] = quota_of(quota_usec, i);
                    last_period_usec[i] = period_usec[i];
                    written++;
                }
            }
            status[i] = settle(&t->e[i], t->err[k]);
        }
    }
    return written;
}

size_t dq_cgtable_read_back(dq_cgtable *t, int64_t *quota_usec, int64_t *period_usec,
                            int32_t *status)
{
    size_t ok = 0;

    for (size_t lo = 0; lo < t->n; lo += t->batch) {
        size_t count = read_batch(t, lo, MAX, MAX_BUF);
        for (size_t k = 0, i = lo; k < count; k++, i++) {
            int64_t quota = 0, period = 0;
            ssize_t n = t->res[k];
            int err = n < 0 ? (int)-n : parse_cpu_max(slot(t, k), (size_t)n, &quota, &period);
            status[i] = settle(&t->e[i], err);
            if (err)
                continue;
            quota_usec[i] = quota;
            period_usec[i] = period;
            ok++;
        }
    }
    return ok;
}

/* Parses the total of the "some" line of cpu.pressure ("some avg10=... total=<usec>");
 * the "full" line and the averages are ignored. Returns 0 or EBADMSG. */
static int parse_pressure_some(const char *buf, size_t len, uint64_t *total)
{
    static const char key[] = " total=";
    const char *end = memchr(buf, '\n', len);
    const char *p;

    if (!end)
        end = buf + len;
    if (end - buf < 5 || memcmp(buf, "some ", 5) != 0)
        return EBADMSG;
    p = memmem(buf, (size_t)(end - buf), key, sizeof key - 1);
    if (!p || parse_u64(p + sizeof key - 1, end, total) != end)
        return EBADMSG;
    return 0;
}

size_t dq_cgtable_pressure(dq_cgtable *t, uint64_t *some_usec, int32_t *status)
{
    size_t ok = 0;

    for (size_t lo = 0; lo < t->n; lo += t->batch) {
        size_t count = read_batch(t, lo, PSI, PSI_BUF);
        for (size_t k = 0, i = lo; k < count; k++, i++) {
            uint64_t total = 0;
            ssize_t n = t->res[k];
            int err = n < 0 ? (int)-n : parse_pressure_some(slot(t, k), (size_t)n, &total);
            status[i] = status_of(err);
            if (err)
                continue;
            some_usec[i] = total;
            ok++;
        }
    }
    return ok;
}

int dq_cgtable_errno(const dq_cgtable *t, size_t i)
{
    return i < t->n ? t->e[i].err : 0;
}
