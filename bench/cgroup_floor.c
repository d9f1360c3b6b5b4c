/* cgroup_floor: the kernel's part of sampling or limiting N cgroups, for the bench: one pread
 * of each cpu.stat ("read"), one pwrite to each cpu.max ("write"), or a pread of each cpu.max
 * and then a pwrite to it ("check-write": what CgroupTable.apply asks of the kernel for a
 * limit it changes, which it first reads to catch a foreign value), with the files kept open
 * and nothing parsed or formatted.
 *
 *     cgroup_floor read|write|check-write PASSES < directories     (one directory per line)
 *
 * Prints the CPU seconds of each pass over all N files, one per line (the process's CPU
 * time, as the bench times ours). A write pass alternates between two quotas, so that
 * every write changes the limit.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    static const char *const values[] = {"50000 100000\n", "60000 100000\n"};
    char line[4096], buf[4096];
    int *fds = NULL, writing, checking, passes;
    size_t n = 0, cap = 0;
    if (argc != 3 ||
        (strcmp(argv[1], "read") && strcmp(argv[1], "write") && strcmp(argv[1], "check-write")) ||
        (passes = atoi(argv[2])) < 1) {
        fprintf(stderr, "usage: %s read|write|check-write PASSES < directories\n", argv[0]);
        return 2;
    }
    checking = strcmp(argv[1], "check-write") == 0;
    writing = checking || strcmp(argv[1], "write") == 0;
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (n == cap && (fds = realloc(fds, (cap = cap ? 2 * cap : 1024) * sizeof *fds)) == NULL)
            return 1;
        strncat(line, writing ? "/cpu.max" : "/cpu.stat", sizeof line - strlen(line) - 1);
        if ((fds[n++] = open(line, checking ? O_RDWR : writing ? O_WRONLY : O_RDONLY)) < 0) {
            perror(line);
            return 1;
        }
    }
    for (int pass = 0; pass < passes; pass++) {
        const char *value = values[pass % 2];
        size_t len = strlen(value);
        double start = now();
        for (size_t i = 0; i < n; i++) {
            if (((checking || !writing) && pread(fds[i], buf, sizeof buf, 0) <= 0) ||
                (writing && pwrite(fds[i], value, len, 0) <= 0)) {
                perror(argv[1]);
                return 1;
            }
        }
        printf("%.9f\n", now() - start);
    }
    return 0;
}
