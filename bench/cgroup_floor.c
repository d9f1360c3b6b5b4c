/* cgroup_floor: the kernel's part of sampling or limiting N cgroups, for the bench: one pread
 * of each cpu.stat, or one pwrite of the same value to each cpu.max, with the files kept
 * open and nothing parsed or formatted.
 *
 *     cgroup_floor read|write PASSES < directories     (one cgroup directory per line)
 *
 * Prints the seconds of each pass over all N files, one per line. A write pass alternates
 * between two quotas, so that every write changes the limit.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static const char *const values[] = {"50000 100000\n", "60000 100000\n"};
    char line[4096], buf[4096];
    int *fds = NULL, writing, passes;
    size_t n = 0, cap = 0;
    if (argc != 3 || (strcmp(argv[1], "read") && strcmp(argv[1], "write")) ||
        (passes = atoi(argv[2])) < 1) {
        fprintf(stderr, "usage: %s read|write PASSES < directories\n", argv[0]);
        return 2;
    }
    writing = strcmp(argv[1], "write") == 0;
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (n == cap && (fds = realloc(fds, (cap = cap ? 2 * cap : 1024) * sizeof *fds)) == NULL)
            return 1;
        strncat(line, writing ? "/cpu.max" : "/cpu.stat", sizeof line - strlen(line) - 1);
        if ((fds[n++] = open(line, writing ? O_WRONLY : O_RDONLY)) < 0) {
            perror(line);
            return 1;
        }
    }
    for (int pass = 0; pass < passes; pass++) {
        const char *value = values[pass % 2];
        size_t len = strlen(value);
        double start = now();
        for (size_t i = 0; i < n; i++) {
            if ((writing ? pwrite(fds[i], value, len, 0) : pread(fds[i], buf, sizeof buf, 0)) <= 0) {
                perror(writing ? "pwrite" : "pread");
                return 1;
            }
        }
        printf("%.9f\n", now() - start);
    }
    return 0;
}
