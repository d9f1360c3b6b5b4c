/* The daemon's side of the latency rings (format: dqoes_probe.h, docs/ring-format.md).
 *
 * A table holds one reader per managed container. Each ring is mapped read-only, and
 * dq_ring_drain reads the rings as memory: a ring with nothing new costs a few loads and no
 * system call. A ring is hostile input: a container that truncates its file under the
 * mapping makes the next read raise SIGBUS, which a handler turns into a fault of that ring
 * alone (any other SIGBUS goes on to the handler installed before, as if ours were not
 * there). The drain copies each ring's new slots into the table's own buffer, keeps the
 * published, valid records and adds them to per-ring window accumulators (latencies: exact
 * count, sum and max, and a log-linear histogram; progress values: count, first and
 * last). dq_ring_take_window turns the accumulators into window statistics and starts the
 * next window. A ring that misbehaves only ever changes its own entry's status and
 * counters; the arrays passed in are owned by the caller.
 */
#ifndef DQOES_RING_H
#define DQOES_RING_H

#include <stddef.h>
#include <stdint.h>

#include "dqoes_probe.h"

/* Per-ring status after the last call. From DQ_RING_CLOSED on, the ring is closed and
 * stays so until it is attached again. */
#define DQ_RING_OK          0
#define DQ_RING_UNUSED      1 /* no ring for this entry */
#define DQ_RING_RESYNCED    2 /* the write counter went backwards or jumped: skipped ahead */
#define DQ_RING_MISSING     3 /* nothing at the path */
#define DQ_RING_NOT_REGULAR 4 /* a symlink, FIFO, directory... */
#define DQ_RING_BAD_SIZE    5 /* truncated, grown, or not fully allocated */
#define DQ_RING_BAD_HEADER  6 /* magic, version, sizes or capacity differ from the table's */
#define DQ_RING_REPLACED    7 /* the path names another file than the one opened */
#define DQ_RING_IO_ERROR    8 /* a failed or short read, or another error */
#define DQ_RING_CLOSED      DQ_RING_MISSING

/* Rows of the counters array, uint64_t[DQ_RING_NCOUNTERS][n]; they only grow. */
#define DQ_RING_RECORDS          0 /* valid records read */
#define DQ_RING_LOST_OVERRUN     1 /* records overwritten before they were read */
#define DQ_RING_TORN             2 /* slots never published, or torn */
#define DQ_RING_INVALID          3 /* published records with nonsense values */
#define DQ_RING_FAULTS           4 /* faults found by drains (status >= DQ_RING_RESYNCED) */
#define DQ_RING_PRODUCER_DROPPED 5 /* the header's dropped counter, as last read */
#define DQ_RING_PROGRESS         6 /* valid progress records read */
#define DQ_RING_NCOUNTERS        7

/* Rows of the window statistics, double[DQ_RING_NSTATS][n], in seconds (NaN: no record). */
#define DQ_RING_MEAN   0
#define DQ_RING_P50    1
#define DQ_RING_P90    2
#define DQ_RING_P95    3
#define DQ_RING_P99    4
#define DQ_RING_MAX    5
#define DQ_RING_NSTATS 6

/* Rows of the window's progress values (double[2][n]) and their times (uint64_t[2][n],
 * CLOCK_MONOTONIC ns): the earliest and the latest record of the window (NaN and 0: none). */
#define DQ_RING_FIRST 0
#define DQ_RING_LAST  1

/* Histogram: exact below 64 ns, then 32 linear sub-buckets per power of two up to
 * DQOES_RING_MAX_LATENCY_NS. A bucket's midpoint is within 1/64 (1.6%) of any value in it. */
#define DQ_RING_SUB_BITS 5
#define DQ_RING_NBUCKETS 1216

/* Where create_ring moves what it finds in a ring's place and cannot replace by a rename
 * (a directory), in the ring's own directory: moving is one rename however large the
 * tree, and dq_ring_sweep removes it a bounded amount at a time. */
#define DQ_RING_JUNK_DIR ".junk"

/* How far in the future (of the reader's clock) a record's end time may be. */
#define DQ_RING_END_SLACK_NS 1000000000ULL

/* How long a drain waits for a claimed slot to be published before it counts it as torn
 * and reads on (at least until the next drain). */
#define DQ_RING_STALL_NS 100000000ULL

/* One latency record, as captured by dq_ring_drain for callers that want them all. */
struct dq_ring_record {
    uint32_t ring;
    uint32_t reserved;
    uint64_t end_ns;
    uint64_t latency_ns;
};

typedef struct dq_ring_table dq_ring_table;

/* A table of n entries (all DQ_RING_UNUSED) for rings of the given capacity, writing into
 * counters (uint64_t[DQ_RING_NCOUNTERS * n], zeroed by the caller), status and last_fault
 * (int8_t[n] each). It holds one inotify instance, watching each ring's file (without one,
 * every drain looks up every ring's path). Installs the SIGBUS handler, or installs it again on top
 * of one installed since. Returns NULL for a bad capacity or when out of memory. */
dq_ring_table *dq_ring_table_new(size_t n, uint64_t capacity, uint64_t *counters, int8_t *status,
                                 int8_t *last_fault);
void dq_ring_table_free(dq_ring_table *t);

/* (Re)opens entry i on the ring file at path, never following a symlink there nor opening
 * anything but a regular file of the right size and header, fully allocated (a sparse ring
 * could make its producers fault once the filesystem is full), and maps it read-only.
 * Reading starts at the ring's current write position. Returns the entry's new status (a
 * failure sets status and last_fault but is not counted in the faults counter). */
int dq_ring_attach(dq_ring_table *t, size_t i, const char *path, uint64_t now_ns);

/* dst takes src's inotify instance in place of its own, with the watches of the rings it
 * will adopt from src: an adopted ring keeps its watch, where it would be removed from src's
 * instance and added again to dst's, and no instance is closed (closing one waits for the
 * kernel to free its watches: 0.2 s a rebuild of 2,000 rings on a loaded host). Call before
 * dq_ring_adopt, on a new dst; src, freed before dst, removes the watches of its rings
 * not adopted. */
void dq_ring_share_inotify(dq_ring_table *dst, dq_ring_table *src);

/* Moves entry j of src (mapping, position, window, counters) to entry i of dst, leaving
 * src's entry unused: for rebuilding a table without losing a window. -1 if the capacities
 * differ. */
int dq_ring_adopt(dq_ring_table *dst, size_t i, dq_ring_table *src, size_t j);

/* Reads the new records of every open ring into the window accumulators. When out is not
 * NULL, the first out_len accepted latency records are also copied there. Returns the
 * number of latency records accepted (progress records are counted apart). now_ns is the
 * reader's CLOCK_MONOTONIC time. One read of the inotify instance tells which rings' files
 * changed otherwise than through a mapping (truncated, grown, written, linked, unlinked,
 * renamed over, moved); only those rings' paths are looked up (and every ring's that is
 * not watched). Drains of all tables in the process take turns. */
uint64_t dq_ring_drain(dq_ring_table *t, uint64_t now_ns, struct dq_ring_record *out,
                       uint64_t out_len);

/* Fills count (int64_t[n]) and stats (double[DQ_RING_NSTATS * n]) with the window's
 * latencies, progress (int64_t[n]), progress_value (double[2 * n]) and progress_ns
 * (uint64_t[2 * n]) with its progress records, then empties the accumulators. */
void dq_ring_take_window(dq_ring_table *t, int64_t *count, double *stats, int64_t *progress,
                         double *progress_value, uint64_t *progress_ns);

/* Removes up to about budget entries of the junk that create_ring set aside in directory
 * dir (DQ_RING_JUNK_DIR), without recursion and without following any symlink: a
 * directory is emptied by moving its entries up into the junk directory, so no walk goes
 * deeper than one level, however deep the tree. Returns 1 if junk is left and this call
 * removed or moved some, 0 when there is none left or none could be removed. */
int dq_ring_sweep(const char *dir, unsigned budget);

/* Size of a ring file of that capacity, 0 if the capacity is not allowed. */
uint64_t dq_ring_file_size(uint64_t capacity);
/* Writes a fresh header (DQOES_RING_HEADER_SIZE bytes) for that capacity into buf.
 * Returns -1 if the capacity is not allowed. */
int dq_ring_format_header(void *buf, uint64_t capacity);

#endif
