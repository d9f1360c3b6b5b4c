/* A table of cgroup v2 directories, opened once and then sampled and limited in one call
 * per operation for all of them.
 *
 * Each entry keeps a descriptor to its cgroup's cpu.stat (read), cpu.max and cpu.weight
 * (read/write) and cpu.pressure, memory.pressure and io.pressure (read, where the kernel
 * has them); one entry that cannot be opened, vanishes or holds something unexpected never
 * fails the batch: every operation fills a per-entry status instead. The arrays passed to
 * the operations are owned by the caller and have one element per entry.
 */
#ifndef DQOES_CGTABLE_H
#define DQOES_CGTABLE_H

#include <stddef.h>
#include <stdint.h>

/* Per-entry status. */
#define DQ_CG_OK        0 /* done (for apply: written, or already holding that value) */
#define DQ_CG_GONE      1 /* the cgroup (or its file) no longer exists */
#define DQ_CG_MALFORMED 2 /* the file's content could not be parsed */
#define DQ_CG_ERROR     3 /* any other failure; dq_cgtable_errno() tells which */
#define DQ_CG_SKIPPED   4 /* not read: the caller did not ask for it (pressure only) */

/* The range of cpu.weight. */
#define DQ_CG_WEIGHT_MIN 1
#define DQ_CG_WEIGHT_MAX 10000

typedef struct dq_cgtable dq_cgtable;

/* Opens the n directories (a NULL one is left closed, for dq_cgtable_adopt). Returns NULL
 * only when out of memory; an entry that failed to open reports its status on every later
 * operation. */
dq_cgtable *dq_cgtable_open(const char *const *dirs, size_t n);
void dq_cgtable_close(dq_cgtable *t);

/* Moves entry j of src (its open descriptors) to entry i of dst, closing what dst's entry
 * held; src's entry is left closed (EBADF). For rebuilding a table without reopening the
 * cgroups both tables share. Returns -1 for an index out of range. */
int dq_cgtable_adopt(dq_cgtable *dst, size_t i, dq_cgtable *src, size_t j);

/* Reads cpu.stat of every entry. Where status is OK the four counters are updated; other
 * entries keep their previous values. Returns the number of OK entries. */
size_t dq_cgtable_sample(dq_cgtable *t, uint64_t *usage_usec, uint64_t *throttled_usec,
                         uint64_t *nr_periods, uint64_t *nr_throttled, int32_t *status);

/* Writes "<quota> <period>" (quota < 0: "max <period>") to cpu.max where (quota, period)
 * differs from (last_quota, last_period), and records what was written there. A
 * last_period of 0 means "unknown" and forces the write. A requested period of 0 leaves
 * the entry alone (not written, status unchanged). Before writing over a known last value,
 * reads cpu.max: foreign[i] becomes 1 if it held something else (someone else wrote it; the
 * value is stored in found_quota/found_period[i]), else 0; untouched for entries not
 * written.
 *
 * cpu.weight likewise, in the same pass, where weight is not NULL: weight[i] (1 to 10000;
 * 0 leaves the entry's weight alone) is written where it differs from last_weight[i] (0:
 * unknown), with its own weight_status, weight_foreign and found_weight; its errno is
 * dq_cgtable_weight_errno's. Returns the number of files written. */
size_t dq_cgtable_apply(dq_cgtable *t, const int64_t *quota_usec, const int64_t *period_usec,
                        int64_t *last_quota_usec, int64_t *last_period_usec, int32_t *status,
                        uint8_t *foreign, int64_t *found_quota_usec, int64_t *found_period_usec,
                        const int64_t *weight, int64_t *last_weight, int32_t *weight_status,
                        uint8_t *weight_foreign, int64_t *found_weight);

/* Reads cpu.max of every entry: quota -1 stands for "max"; and, where weight is not NULL,
 * cpu.weight into weight with its own weight_status. Returns the number of entries whose
 * cpu.max is OK. */
size_t dq_cgtable_read_back(dq_cgtable *t, int64_t *quota_usec, int64_t *period_usec,
                            int32_t *status, int64_t *weight, int32_t *weight_status);

/* The pressure files read, in this order: cpu.pressure, memory.pressure, io.pressure. */
#define DQ_PSI_RESOURCES 3

/* Reads the total of the "some" line of cpu.pressure of every entry i with want[i] != 0
 * (of every entry when want is NULL): the time, in microseconds, during which at least one
 * of its tasks was runnable but waited for a CPU (pressure stall information; a kernel
 * without it has no such file, and every entry reports that). Where status is OK the total
 * is updated; an entry not wanted is not read, its status is DQ_CG_SKIPPED and its total
 * left as it was, unless it has no open cpu.pressure, whose failure it reports as when
 * wanted (that costs no read). This status is not the entry's (dq_cgtable_errno is not
 * changed). Returns the number of OK entries.
 *
 * Where stall_usec is not NULL, every entry's three pressure files are read (each once:
 * the wanted cpu totals above come from the same read) into stall_usec, avg10_centi and
 * stall_status, of DQ_PSI_RESOURCES * n elements each, resource-major (element r * n + i):
 * the "some" total, its avg10 in hundredths of a percent, and the status; a value whose
 * status is not OK is left as it was. */
size_t dq_cgtable_pressure(dq_cgtable *t, const uint8_t *want, uint64_t *some_usec, int32_t *status,
                           uint64_t *stall_usec, uint32_t *avg10_centi, int32_t *stall_status);

/* Parses the "some" line of a pressure file ("some avg10=1.25 avg60=... total=<usec>",
 * the first line; the rest is ignored), as /proc/pressure/ has them too. Returns 0 or
 * EBADMSG. */
int dq_psi_parse_some(const char *buf, size_t len, uint64_t *total, uint32_t *avg10_centi);

/* The errno behind entry i's last non-OK status (EBADMSG for malformed content), else 0;
 * dq_cgtable_weight_errno: the same for its cpu.weight. */
int dq_cgtable_errno(const dq_cgtable *t, size_t i);
int dq_cgtable_weight_errno(const dq_cgtable *t, size_t i);

#endif
