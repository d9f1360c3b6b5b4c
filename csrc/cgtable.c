/* A table of cgroup v2 directories: see cgtable.h.
 *
 * The files are kernel-generated, but the daemon runs as root beside untrusted containers,
 * so everything read is parsed strictly by hand into bounded buffers, nothing is opened
 * through a symlink, and a file that is not a regular file (a FIFO that would block) is
 * refused at open.
 */
#define _GNU_SOURCE
#include "cgtable.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
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

struct dq_cgentry {
    int stat_fd; /* >= 0: open descriptor; < 0: -errno of the failed open */
    int max_fd;
    int psi_fd;     /* cpu.pressure; < 0 (-errno) on kernels without pressure information */
    int mem_psi_fd; /* memory.pressure and io.pressure, likewise */
    int io_psi_fd;
    int weight_fd;  /* cpu.weight */
    int err;        /* errno behind the last non-OK status (cpu.stat, cpu.max) */
    int weight_err; /* errno behind the last non-OK status of cpu.weight */
};

struct dq_cgtable {
    size_t n;
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

/* Returns a descriptor to the regular file dirfd/name, or -errno. */
static int open_file(int dirfd, const char *name, int flags)
{
    struct stat st;
    int fd = open_nofollow(dirfd, name, flags | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    int err = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (err) {
        close(fd);
        return -err;
    }
    return fd;
}

static void open_entry(struct dq_cgentry *e, const char *dir)
{
    int dirfd = open_nofollow(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY);
    if (dirfd < 0) {
        e->err = e->weight_err = errno;
        e->stat_fd = e->max_fd = e->psi_fd = e->mem_psi_fd = e->io_psi_fd = e->weight_fd = -e->err;
        return;
    }
    e->stat_fd = open_file(dirfd, "cpu.stat", O_RDONLY);
    e->max_fd = open_file(dirfd, "cpu.max", O_RDWR);
    e->psi_fd = open_file(dirfd, "cpu.pressure", O_RDONLY); /* optional: not in e->err */
    e->mem_psi_fd = open_file(dirfd, "memory.pressure", O_RDONLY);
    e->io_psi_fd = open_file(dirfd, "io.pressure", O_RDONLY);
    e->weight_fd = open_file(dirfd, "cpu.weight", O_RDWR); /* its own error: weight_err */
    e->err = e->stat_fd < 0 ? -e->stat_fd : e->max_fd < 0 ? -e->max_fd : 0;
    e->weight_err = e->weight_fd < 0 ? -e->weight_fd : 0;
    close(dirfd);
}

dq_cgtable *dq_cgtable_open(const char *const *dirs, size_t n)
{
    if (n > (SIZE_MAX - sizeof(dq_cgtable)) / sizeof(struct dq_cgentry))
        return NULL;
    dq_cgtable *t = malloc(sizeof *t + n * sizeof t->e[0]);
    if (!t)
        return NULL;
    t->n = n;
    for (size_t i = 0; i < n; i++) {
        if (dirs[i])
            open_entry(&t->e[i], dirs[i]);
        else /* to be adopted from another table */
            t->e[i] = (struct dq_cgentry){.stat_fd = -EBADF,
                                          .max_fd = -EBADF,
                                          .psi_fd = -EBADF,
                                          .mem_psi_fd = -EBADF,
                                          .io_psi_fd = -EBADF,
                                          .weight_fd = -EBADF,
                                          .err = EBADF,
                                          .weight_err = EBADF};
    }
    return t;
}

/* Closes every descriptor the entry holds; it is left closed (EBADF). */
static void close_entry(struct dq_cgentry *e)
{
    int *fds[] = {&e->stat_fd,    &e->max_fd,    &e->psi_fd,
                  &e->mem_psi_fd, &e->io_psi_fd, &e->weight_fd};
    for (size_t k = 0; k < sizeof fds / sizeof fds[0]; k++) {
        if (*fds[k] >= 0)
            close(*fds[k]);
        *fds[k] = -EBADF;
    }
    e->err = e->weight_err = EBADF;
}

int dq_cgtable_adopt(dq_cgtable *dst, size_t i, dq_cgtable *src, size_t j)
{
    if (i >= dst->n || j >= src->n)
        return -1;
    struct dq_cgentry *to = &dst->e[i], *from = &src->e[j];
    close_entry(to);
    *to = *from;
    from->stat_fd = from->max_fd = from->psi_fd = from->mem_psi_fd = from->io_psi_fd =
        from->weight_fd = -EBADF;
    from->err = from->weight_err = EBADF;
    return 0;
}

void dq_cgtable_close(dq_cgtable *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        close_entry(&t->e[i]);
    free(t);
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

/* Reads the whole file from offset 0. Returns its length, or -errno; content that fills
 * the buffer may be truncated and counts as malformed. */
static ssize_t read_all(int fd, char *buf, size_t cap)
{
    ssize_t n;
    do
        n = pread(fd, buf, cap, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n < cap ? n : -EBADMSG;
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

/* The key of a cpu.stat line that we read, or -1. Compared by length first, then with
 * constant sizes, which the compiler turns into a few loads (a loop over a table of keys
 * took most of the parsing's time: perf, N = 1,000). */
static int stat_key(const char *p, size_t len)
{
    switch (len) {
    case 10:
        return memcmp(p, "usage_usec", 10) == 0   ? USAGE
               : memcmp(p, "nr_periods", 10) == 0 ? PERIODS
                                                  : -1;
    case 12:
        return memcmp(p, "nr_throttled", 12) == 0 ? NR_THROTTLED : -1;
    case 14:
        return memcmp(p, "throttled_usec", 14) == 0 ? THROTTLED : -1;
    default:
        return -1;
    }
}

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
        int k = stat_key(p, (size_t)(space - p));
        if (k >= 0) {
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
    char buf[STAT_BUF];
    size_t ok = 0;

    for (size_t i = 0; i < t->n; i++) {
        struct dq_cgentry *e = &t->e[i];
        uint64_t v[NKEYS] = {0};
        ssize_t n = e->stat_fd < 0 ? e->stat_fd : read_all(e->stat_fd, buf, sizeof buf);
        int err = n < 0 ? (int)-n : parse_cpu_stat(buf, (size_t)n, v);
        status[i] = settle(e, err);
        if (err)
            continue;
        usage_usec[i] = v[USAGE];
        throttled_usec[i] = v[THROTTLED];
        nr_periods[i] = v[PERIODS];
        nr_throttled[i] = v[NR_THROTTLED];
        ok++;
    }
    return ok;
}

/* Puts the decimal digits of v before end; returns where they start. */
static char *put_u64(char *end, uint64_t v)
{
    do
        *--end = (char)('0' + v % 10);
    while (v /= 10);
    return end;
}

/* Writes the bytes from p to end at offset 0 of fd, whole. Returns 0 or an errno. */
static int write_whole(int fd, const char *p, const char *end)
{
    ssize_t n;
    do
        n = pwrite(fd, p, (size_t)(end - p), 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno;
    return n == end - p ? 0 : EIO;
}

/* Writes one cpu.max value, "<quota> <period>\n" or "max <period>\n" (period > 0). Returns 0
 * or an errno. Formatted by hand: snprintf took a tenth of apply's time (perf, N = 1,000). */
static int write_cpu_max(int fd, int64_t quota, int64_t period)
{
    char buf[MAX_BUF]; /* two int64 and three bytes fit */
    char *end = buf + sizeof buf, *p = end;

    *--p = '\n';
    p = put_u64(p, (uint64_t)period);
    *--p = ' ';
    if (quota < 0)
        p = memcpy(p - 3, "max", 3);
    else
        p = put_u64(p, (uint64_t)quota);
    return write_whole(fd, p, end);
}

/* Writes one cpu.weight value, "<weight>\n". Returns 0 or an errno. */
static int write_cpu_weight(int fd, int64_t weight)
{
    char buf[MAX_BUF];
    char *end = buf + sizeof buf, *p = end;

    *--p = '\n';
    p = put_u64(p, (uint64_t)weight);
    return write_whole(fd, p, end);
}

/* Parses "<weight>", the single line the kernel writes (1 to 10000); what follows that line
 * is ignored. Returns 0 or EBADMSG. */
static int parse_cpu_weight(const char *buf, size_t len, int64_t *weight)
{
    const char *end = memchr(buf, '\n', len);
    uint64_t w = 0;

    if (!end)
        end = buf + len;
    if (parse_u64(buf, end, &w) != end || w < DQ_CG_WEIGHT_MIN || w > DQ_CG_WEIGHT_MAX)
        return EBADMSG;
    *weight = (int64_t)w;
    return 0;
}

/* Reads and parses the entry's cpu.weight. Returns 0 or an errno. */
static int read_cpu_weight(const struct dq_cgentry *e, int64_t *weight)
{
    char buf[MAX_BUF];
    ssize_t n = e->weight_fd < 0 ? e->weight_fd : read_all(e->weight_fd, buf, sizeof buf);
    return n < 0 ? (int)-n : parse_cpu_weight(buf, (size_t)n, weight);
}

/* Whether the entry's cpu.max still holds (quota, period): 1 if it does, 0 if it holds
 * anything else (stored in *found_quota, *found_period), -1 if it cannot be read. */
static int holds(struct dq_cgentry *e, int64_t quota, int64_t period, int64_t *found_quota,
                 int64_t *found_period)
{
    char buf[MAX_BUF];
    int64_t q, p;
    ssize_t n = read_all(e->max_fd, buf, sizeof buf);
    if (n < 0 || parse_cpu_max(buf, (size_t)n, &q, &p) != 0)
        return -1;
    *found_quota = q;
    *found_period = p;
    return q == quota && p == period;
}

/* apply's cpu.weight half for one entry (weight != 0): as for cpu.max, written where the
 * request differs from the last write, and someone else's value in place of our last one
 * flagged before it is written over. Returns 1 if written, else 0. */
static size_t apply_weight(struct dq_cgentry *e, int64_t weight, int64_t *last_weight,
                           int32_t *status, uint8_t *foreign, int64_t *found_weight)
{
    size_t written = 0;
    int err = 0;

    if (e->weight_fd < 0) {
        err = -e->weight_fd;
    } else if (weight < DQ_CG_WEIGHT_MIN || weight > DQ_CG_WEIGHT_MAX) {
        err = EINVAL;
    } else if (weight != *last_weight) {
        int64_t found = 0;
        *foreign = *last_weight != 0 && read_cpu_weight(e, &found) == 0 && found != *last_weight;
        if (*foreign)
            *found_weight = found;
        if ((err = write_cpu_weight(e->weight_fd, weight)) == 0) {
            *last_weight = weight;
            written = 1;
        }
    }
    e->weight_err = err;
    *status = status_of(err);
    return written;
}

size_t dq_cgtable_apply(dq_cgtable *t, const int64_t *quota_usec, const int64_t *period_usec,
                        int64_t *last_quota_usec, int64_t *last_period_usec, int32_t *status,
                        uint8_t *foreign, int64_t *found_quota_usec, int64_t *found_period_usec,
                        const int64_t *weight, int64_t *last_weight, int32_t *weight_status,
                        uint8_t *weight_foreign, int64_t *found_weight)
{
    size_t written = 0;

    for (size_t i = 0; i < t->n; i++) {
        struct dq_cgentry *e = &t->e[i];
        int64_t quota = quota_usec[i] < 0 ? -1 : quota_usec[i];
        int64_t period = period_usec[i];
        int err;

        if (weight && weight[i] != 0) /* 0: the caller leaves this cgroup's weight alone */
            written += apply_weight(e, weight[i], &last_weight[i], &weight_status[i],
                                    &weight_foreign[i], &found_weight[i]);
        if (period == 0) /* the caller leaves this cgroup's limit alone */
            continue;
        if (e->max_fd < 0) {
            err = -e->max_fd;
        } else if (period < 0) {
            err = EINVAL;
        } else if (quota == last_quota_usec[i] && period == last_period_usec[i]) {
            err = 0;
        } else {
            /* Someone else's value in place of ours is a foreign write, even when ours is
             * about to replace it: the reconcile would never see it. */
            foreign[i] =
                last_period_usec[i] != 0 && holds(e, last_quota_usec[i], last_period_usec[i],
                                                  &found_quota_usec[i], &found_period_usec[i]) == 0;
            if ((err = write_cpu_max(e->max_fd, quota, period)) == 0) {
                last_quota_usec[i] = quota;
                last_period_usec[i] = period;
                written++;
            }
        }
        status[i] = settle(e, err);
    }
    return written;
}

size_t dq_cgtable_read_back(dq_cgtable *t, int64_t *quota_usec, int64_t *period_usec,
                            int32_t *status, int64_t *weight, int32_t *weight_status)
{
    char buf[MAX_BUF];
    size_t ok = 0;

    for (size_t i = 0; i < t->n; i++) {
        struct dq_cgentry *e = &t->e[i];
        int64_t quota = 0, period = 0, w = 0;
        if (weight) {
            int werr = read_cpu_weight(e, &w);
            e->weight_err = werr;
            weight_status[i] = status_of(werr);
            if (!werr)
                weight[i] = w;
        }
        ssize_t n = e->max_fd < 0 ? e->max_fd : read_all(e->max_fd, buf, sizeof buf);
        int err = n < 0 ? (int)-n : parse_cpu_max(buf, (size_t)n, &quota, &period);
        status[i] = settle(e, err);
        if (err)
            continue;
        quota_usec[i] = quota;
        period_usec[i] = period;
        ok++;
    }
    return ok;
}

/* Parses avg10's "<int>.<two digits>" (a percentage) at p into hundredths of a percent,
 * up to 100.00. Returns the first byte after it, or NULL. */
static const char *parse_centi(const char *p, const char *end, uint32_t *out)
{
    uint64_t whole = 0;
    if (!(p = parse_u64(p, end, &whole)) || end - p < 3 || p[0] != '.' || p[1] < '0' ||
        p[1] > '9' || p[2] < '0' || p[2] > '9')
        return NULL;
    uint64_t centi = whole * 100 + (uint64_t)(p[1] - '0') * 10 + (uint64_t)(p[2] - '0');
    if (whole > 100 || centi > 10000)
        return NULL;
    *out = (uint32_t)centi;
    return p + 3;
}

int dq_psi_parse_some(const char *buf, size_t len, uint64_t *total, uint32_t *avg10_centi)
{
    static const char avg10[] = "some avg10=", key[] = " total=";
    const char *end = memchr(buf, '\n', len);
    const char *p;
    uint32_t avg = 0;

    if (!end)
        end = buf + len;
    if ((size_t)(end - buf) < sizeof avg10 - 1 || memcmp(buf, avg10, sizeof avg10 - 1) != 0)
        return EBADMSG;
    p = parse_centi(buf + sizeof avg10 - 1, end, &avg);
    if (!p || p == end || *p != ' ')
        return EBADMSG;
    p = memmem(p, (size_t)(end - p), key, sizeof key - 1);
    if (!p || parse_u64(p + sizeof key - 1, end, total) != end)
        return EBADMSG;
    *avg10_centi = avg;
    return 0;
}

/* Reads and parses the "some" line of the pressure file fd (< 0: -errno of its open).
 * Returns 0 or an errno. */
static int read_psi(int fd, uint64_t *total, uint32_t *avg10_centi)
{
    char buf[PSI_BUF];
    ssize_t n = fd < 0 ? fd : read_all(fd, buf, sizeof buf);
    return n < 0 ? (int)-n : dq_psi_parse_some(buf, (size_t)n, total, avg10_centi);
}

size_t dq_cgtable_pressure(dq_cgtable *t, const uint8_t *want, uint64_t *some_usec, int32_t *status,
                           uint64_t *stall_usec, uint32_t *avg10_centi, int32_t *stall_status)
{
    size_t ok = 0, n = t->n;

    for (size_t i = 0; i < n; i++) {
        const struct dq_cgentry *e = &t->e[i];
        uint64_t total = 0;
        uint32_t avg = 0;
        int err = 0;
        if (stall_usec) { /* every entry's three files, each read once */
            int fds[DQ_PSI_RESOURCES] = {e->psi_fd, e->mem_psi_fd, e->io_psi_fd};
            for (size_t r = 0; r < DQ_PSI_RESOURCES; r++) {
                size_t k = r * n + i;
                uint64_t stalled = 0;
                int rerr = read_psi(fds[r], &stalled, &avg);
                stall_status[k] = status_of(rerr);
                if (!rerr) { /* a bad file leaves its last values */
                    stall_usec[k] = stalled;
                    avg10_centi[k] = avg;
                }
                if (r == 0) {
                    err = rerr;
                    total = stalled;
                }
            }
        }
        if (want && !want[i] && e->psi_fd >= 0) { /* without the file: reported below */
            status[i] = DQ_CG_SKIPPED;
            continue;
        }
        if (!stall_usec)
            err = read_psi(e->psi_fd, &total, &avg);
        status[i] = status_of(err);
        if (err)
            continue;
        some_usec[i] = total;
        ok++;
    }
    return ok;
}

int dq_cgtable_errno(const dq_cgtable *t, size_t i)
{
    return i < t->n ? t->e[i].err : 0;
}

int dq_cgtable_weight_errno(const dq_cgtable *t, size_t i)
{
    return i < t->n ? t->e[i].weight_err : 0;
}
