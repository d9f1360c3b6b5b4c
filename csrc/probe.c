#include "probe.h"

struct dqoes_probe *dq_probe_open(const char *path) { return dqoes_probe_open(path); }

void dq_probe_close(struct dqoes_probe *p) { dqoes_probe_close(p); }

int dq_probe_attached(struct dqoes_probe *p) { return dqoes_probe_attached(p); }

void dq_probe_record_seconds(struct dqoes_probe *p, double seconds) {
    /* Written so that NaN fails the test; 0 stands for "invalid" in dqoes_probe_record. */
    double ns = seconds * 1e9 + 0.5;
    dqoes_probe_record(p, ns >= 1.0 && ns <= (double)DQOES_RING_MAX_LATENCY_NS ? (uint64_t)ns : 0);
}

void dq_probe_record_ns(struct dqoes_probe *p, int64_t latency_ns) {
    dqoes_probe_record(p, latency_ns > 0 ? (uint64_t)latency_ns : 0);
}

void dq_probe_progress(struct dqoes_probe *p, double value) { dqoes_probe_progress(p, value); }

uint64_t dq_probe_now_ns(void) { return dqoes_probe_now_ns(); }
