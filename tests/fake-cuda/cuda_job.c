/*
 * A CUDA job for the end-to-end tests: it loads the driver library as the CUDA runtime does
 * (dlopen "libcuda.so.1", dlsym each entry point) and runs a script of driver calls, so what
 * gpuwatch's probes count can be checked against what the job did.
 *
 *   cuda_job [--wait FILE] [--seconds S] OP...
 *
 * --wait: start once FILE exists (after printing "ready"); --seconds: repeat the OPs until S
 * seconds have passed (else run them once). Then print what was called ("done launches=N
 * h2d=N h2d_bytes=N d2h=N d2h_bytes=N syncs=N") and sleep until killed: the process stays a
 * GPU process, as a trainer does between steps.
 *
 * OPs: launch:N[:US] (N kernel launches, spinning US us of host time before each: eager
 * PyTorch's launch took 7.5 us on the H100 host), h2d:BYTES and d2h:BYTES (a copy and a stream
 * synchronise: a blocking tensor.to() / .cpu()), item (a launch, a 4-byte device-to-host copy,
 * a stream synchronise), sync (cuCtxSynchronize_v2: torch.cuda.synchronize()), hostfn:US (a
 * host function holding the stream US us), cpu:US (US us of the job's own CPU work).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*h2d_fn)(uint64_t, const void *, size_t, void *);
typedef int (*d2h_fn)(void *, uint64_t, size_t, void *);
typedef int (*stream_fn)(void *);
typedef int (*ctx_fn)(void);
typedef int (*hostfn_fn)(void *, void (*)(void *), void *);

static launch_fn launch;
static h2d_fn h2d;
static d2h_fn d2h;
static stream_fn stream_sync;
static ctx_fn ctx_sync;
static hostfn_fn host_func;
static unsigned long n_launch, n_h2d, n_d2h, n_sync;
static unsigned long long h2d_bytes, d2h_bytes;
static char buf[4];

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void spin_us(double us) {
    double end = now_s() + us / 1e6;
    while (now_s() < end) {
    }
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "cuda_job: %s missing from libcuda.so.1\n", name);
        exit(2);
    }
    return p;
}

static void run(const char *op) {
    unsigned long n = 0;
    double us = 0;
    if (sscanf(op, "launch:%lu:%lf", &n, &us) >= 1 && strncmp(op, "launch:", 7) == 0) {
        for (unsigned long i = 0; i < n; i++) {
            if (us > 0) spin_us(us);
            launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
            n_launch++;
        }
    } else if (sscanf(op, "h2d:%lu", &n) == 1) {
        void *src = malloc(n ? n : 1);
        h2d(0, src, n, 0);
        stream_sync(0);
        free(src);
        n_h2d++;
        h2d_bytes += n;
    } else if (sscanf(op, "d2h:%lu", &n) == 1) {
        void *dst = malloc(n ? n : 1);
        d2h(dst, 0, n, 0);
        stream_sync(0);
        free(dst);
        n_d2h++;
        d2h_bytes += n;
    } else if (strcmp(op, "item") == 0) {
        launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        d2h(buf, 0, 4, 0);
        stream_sync(0);
        n_launch++;
        n_d2h++;
        d2h_bytes += 4;
    } else if (strcmp(op, "sync") == 0) {
        ctx_sync();
        n_sync++;
    } else if (sscanf(op, "hostfn:%lu", &n) == 1) {
        host_func(0, 0, (void *)(uintptr_t)n);
    } else if (sscanf(op, "cpu:%lf", &us) == 1) {
        spin_us(us);
    } else {
        fprintf(stderr, "cuda_job: unknown op %s\n", op);
        exit(2);
    }
}

int main(int argc, char **argv) {
    const char *wait_for = NULL;
    double seconds = 0;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc) return 2;
        if (strcmp(argv[i], "--wait") == 0) wait_for = argv[i + 1];
        else if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
        else return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cuda_job: %s\n", dlerror());
        return 2;
    }
    ((int (*)(unsigned))sym(lib, "cuInit"))(0);
    launch = (launch_fn)sym(lib, "cuLaunchKernel");
    h2d = (h2d_fn)sym(lib, "cuMemcpyHtoDAsync_v2");
    d2h = (d2h_fn)sym(lib, "cuMemcpyDtoHAsync_v2");
    stream_sync = (stream_fn)sym(lib, "cuStreamSynchronize");
    ctx_sync = (ctx_fn)sym(lib, "cuCtxSynchronize_v2");
    host_func = (hostfn_fn)sym(lib, "cuLaunchHostFunc");
    printf("ready\n");
    fflush(stdout);
    if (wait_for)
        while (access(wait_for, F_OK) != 0) usleep(10000);
    double end = now_s() + seconds;
    do {
        for (int k = i; k < argc; k++) run(argv[k]);
    } while (now_s() < end);
    printf("done launches=%lu h2d=%lu h2d_bytes=%llu d2h=%lu d2h_bytes=%llu syncs=%lu\n", n_launch,
           n_h2d, h2d_bytes, n_d2h, d2h_bytes, n_sync);
    fflush(stdout);
    for (;;) pause();
}
