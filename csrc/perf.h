/* Hardware counter readings of many perf event groups in one call (dqoes_cg/perfcounters.py).
 *
 * Each descriptor is a group leader opened with PERF_FORMAT_GROUP: one read(2) returns the
 * whole group as `words` 64-bit words. A failed or short read leaves its row all zeros (a
 * group of no counter), which the caller treats as unreadable.
 */
#ifndef DQOES_PERF_H
#define DQOES_PERF_H

#include <stddef.h>
#include <stdint.h>

/* Reads each of the n descriptors into out[i * words ...]; returns how many failed. */
size_t dq_perf_read(const int32_t *fds, size_t n, uint64_t *out, size_t words);

#endif
