/*
 * What a hostile tenant's process can make of its memory map, for the tests of the CUDA probe
 * path (tests/e2e/cuda_tenant.rs): it maps files executable and then sleeps, so that it stays
 * a "GPU process" whose mappings the agent reads.
 *
 *   tenant_maps copies DIR N    maps DIR/libcuda.so.1.0 ... DIR/libcuda.so.1.<N-1> (N driver
 *                               libraries of distinct inodes)
 *   tenant_maps repeat FILE N   maps FILE N times (N lines of its path in /proc/<pid>/maps)
 *
 * Prints "mapped N" once done.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void map(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    /* Each at offset 0: neighbours of the same file at the same offset never merge. */
    if (mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    long n = atol(argv[3]);
    if (strcmp(argv[1], "copies") == 0) {
        char path[4096];
        for (long i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/libcuda.so.1.%ld", argv[2], i);
            map(path);
        }
    } else if (strcmp(argv[1], "repeat") == 0) {
        for (long i = 0; i < n; i++) map(argv[2]);
    } else {
        return 2;
    }
    printf("mapped %ld\n", n);
    fflush(stdout);
    for (;;) pause();
}
