/* infer: the smallest realistic inference server for the end-to-end tests. It serves
 * requests back to back on one thread, each a fixed amount of CPU work, and records every
 * request's latency into the dqoes-cg ring ($DQOES_RING, else /run/dqoes/ring) through
 * csrc/dqoes_probe.h. Built static (`gcc -O2 -static`), so that a container image is this
 * one file (`docker import`).
 *
 *     infer --calibrate MS   print the work units that take MS milliseconds of CPU
 *     infer UNITS            serve requests of UNITS work units each, until killed
 *     infer UNITS RATE       the same, requests arriving on their own at random (Poisson) at
 *                            RATE a second and served first come, first served: a request's
 *                            latency runs from its arrival to its answer, its wait included
 */
#define _POSIX_C_SOURCE 200809L
#include "dqoes_probe.h"

#include <math.h>
#include <stdio.h>
#include <time.h>

static volatile uint64_t sink;

/* One work unit: a short chain of dependent multiply-adds that no compiler can skip. */
static void work(uint64_t units)
{
    uint64_t x = sink | 1;
    for (uint64_t i = 0; i < units * 1000; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* CPU time, not wall time: the answer holds however busy the machine is. */
static uint64_t calibrate(double ms)
{
    uint64_t units = 1, spent;
    for (;;) {
        uint64_t start = cpu_ns();
        work(units);
        spent = cpu_ns() - start;
        if (spent > 200000000ULL)
            break;
        units *= 2;
    }
    return (uint64_t)(ms * 1e6 * (double)units / (double)spent) + 1;
}

/* The gap to the next arrival of a Poisson process of `rate` a second, in ns. */
static uint64_t next_gap_ns(double rate, uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    double u = ((double)(*state >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    return (uint64_t)(-log(u) / rate * 1e9);
}

static void sleep_until_ns(uint64_t when)
{
    struct timespec ts = {(time_t)(when / 1000000000ULL), (long)(when % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--calibrate") == 0) {
        printf("%llu\n", (unsigned long long)calibrate(atof(argv[2])));
        return 0;
    }
    double rate = argc == 3 ? atof(argv[2]) : 0.0;
    if ((argc != 2 && argc != 3) || atoll(argv[1]) <= 0 || (argc == 3 && !(rate > 0.0))) {
        fprintf(stderr, "usage: infer UNITS [RATE] | infer --calibrate MS\n");
        return 2;
    }
    uint64_t units = (uint64_t)atoll(argv[1]);
    struct dqoes_probe *probe = dqoes_probe_open(NULL);
    uint64_t state = dqoes_probe_now_ns(), arrival = dqoes_probe_now_ns();
    for (;;) {
        if (rate > 0.0) { /* open loop: wait for the next arrival, unless it is queued */
            arrival += next_gap_ns(rate, &state);
            if (dqoes_probe_now_ns() < arrival)
                sleep_until_ns(arrival);
        } else {
            arrival = dqoes_probe_now_ns();
        }
        work(units);
        dqoes_probe_record(probe, dqoes_probe_now_ns() - arrival);
    }
}
