/* The Python producer's entry points: dqoes_probe.h behind functions that cffi can call,
 * with the conversion and validation of Python's numbers done here rather than in Python.
 */
#ifndef DQOES_PROBE_SHIM_H
#define DQOES_PROBE_SHIM_H

#include <stdint.h>

#include "dqoes_probe.h"

/* dqoes_probe_open; path NULL means $DQOES_RING or the default path. */
struct dqoes_probe *dq_probe_open(const char *path);
void dq_probe_close(struct dqoes_probe *p);
int dq_probe_attached(struct dqoes_probe *p);
/* A latency that is not in (0, DQOES_RING_MAX_LATENCY_NS] (negative, NaN, infinite, too
 * large) is counted as dropped in the ring's header instead of being written. */
void dq_probe_record_seconds(struct dqoes_probe *p, double seconds);
void dq_probe_record_ns(struct dqoes_probe *p, int64_t latency_ns);
/* dqoes_probe_progress: a value that is not finite is counted as dropped. */
void dq_probe_progress(struct dqoes_probe *p, double value);
uint64_t dq_probe_now_ns(void);

#endif
