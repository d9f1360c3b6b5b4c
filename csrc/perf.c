#include "perf.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

size_t dq_perf_read(const int32_t *fds, size_t n, uint64_t *out, size_t words)
{
    size_t failed = 0;
    size_t bytes = words * sizeof(uint64_t);
    for (size_t i = 0; i < n; i++) {
        uint64_t *row = out + i * words;
        ssize_t got;
        do
            got = read(fds[i], row, bytes);
        while (got < 0 && errno == EINTR);
        if (got != (ssize_t)bytes) {
            memset(row, 0, bytes);
            failed++;
        }
    }
    return failed;
}
