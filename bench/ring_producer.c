/* ring_producer: writes latency records through csrc/dqoes_probe.h, for the ring tests and
 * benchmarks.
 *
 *     ring_producer PATH THREADS RECORDS ID
 *
 * Each of THREADS threads records RECORDS requests; thread t of producer ID gives record k
 * the latency 1 + ((ID * THREADS + t) * RECORDS + k) ns, so that a reader can tell every
 * record apart. Prints "attached=<0|1> records=<total> wall_ns=<time of the busiest loop>
 * clock_ns=<time of RECORDS bare clock reads before that> syscall_ns=<time of RECORDS
 * getppid system calls>", the clock and the system call being the baselines.
 */
#include "dqoes_probe.h"

#include <pthread.h>
#include <stdio.h>

struct job {
    struct dqoes_probe *probe;
    uint64_t first, count, wall_ns;
};

static void *produce(void *arg)
{
    struct job *j = (struct job *)arg;
    uint64_t start = dqoes_probe_now_ns();
    for (uint64_t k = 0; k < j->count; k++)
        dqoes_probe_record(j->probe, 1 + j->first + k);
    j->wall_ns = dqoes_probe_now_ns() - start;
    return NULL;
}

int main(int argc, char **argv)
{
    struct job jobs[64];
    pthread_t threads[64];
    struct dqoes_probe *probe;
    uint64_t records, id, wall_ns = 0, clock_ns, syscall_ns;
    long nthreads;
    if (argc != 5 || (nthreads = atol(argv[2])) < 1 || nthreads > 64) {
        fprintf(stderr, "usage: %s PATH THREADS(1-64) RECORDS ID\n", argv[0]);
        return 2;
    }
    records = strtoull(argv[3], NULL, 10);
    id = strtoull(argv[4], NULL, 10);
    probe = dqoes_probe_open(argv[1]);
    if (probe == NULL)
        return 1;
    clock_ns = dqoes_probe_now_ns();
    for (uint64_t k = 0; k < records; k++)
        (void)dqoes_probe_now_ns();
    clock_ns = dqoes_probe_now_ns() - clock_ns;
    syscall_ns = dqoes_probe_now_ns();
    for (uint64_t k = 0; k < records; k++)
        (void)getppid();
    syscall_ns = dqoes_probe_now_ns() - syscall_ns;
    for (long t = 0; t < nthreads; t++) {
        uint64_t first = (id * (uint64_t)nthreads + (uint64_t)t) * records;
        jobs[t] = (struct job){probe, first, records, 0};
        if (pthread_create(&threads[t], NULL, produce, &jobs[t]) != 0)
            return 1;
    }
    for (long t = 0; t < nthreads; t++) {
        pthread_join(threads[t], NULL);
        wall_ns = jobs[t].wall_ns > wall_ns ? jobs[t].wall_ns : wall_ns;
    }
    printf("attached=%d records=%llu wall_ns=%llu clock_ns=%llu syscall_ns=%llu\n",
           dqoes_probe_attached(probe), (unsigned long long)(records * (uint64_t)nthreads),
           (unsigned long long)wall_ns, (unsigned long long)clock_ns,
           (unsigned long long)syscall_ns);
    dqoes_probe_close(probe);
    return 0;
}
