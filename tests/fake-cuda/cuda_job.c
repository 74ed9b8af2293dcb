/*
 * A CUDA job for the end-to-end tests: it loads the driver library as the CUDA runtime does
 * (dlopen "libcuda.so.1", dlsym each entry point) and runs a script of driver calls, so what
 * gpuwatch's probes count can be checked against what the job did.
 *
 *   cuda_job [--wait FILE] [--seconds S] [--report FILE] OP...
 *
 * The driver library is "libcuda.so.1" found as the dynamic linker finds it, or the file
 * CUDA_JOB_LIB names.
 *
 * --wait: start once FILE exists (after printing "ready"); --seconds: repeat the OPs until S
 * seconds have passed (else run them once); --report: append the job's own tally to FILE every
 * 20 ms while it runs (see below), so a test compares gpuwatch's figures with what the job did
 * in the same span, however fast this machine runs it. Then print what was called ("done
 * launches=N h2d=N h2d_bytes=N d2h=N d2h_bytes=N syncs=N") and sleep until killed: the process
 * stays a GPU process, as a trainer does between steps.
 *
 * OPs: launch:N[:US] (N kernel launches, spinning US us of host time before each: eager
 * PyTorch's launch took 7.5 us on the H100 host), h2d:BYTES and d2h:BYTES (a copy and a stream
 * synchronise: a blocking tensor.to() / .cpu()), item (a launch, a 4-byte device-to-host copy,
 * a stream synchronise), sync (cuCtxSynchronize_v2: torch.cuda.synchronize()), hostfn:US (a
 * host function holding the stream US us), cpu:US (US us of the job's own CPU work).
 *
 * Threads, as a PyTorch process has them: bg:OP runs OP on a second thread of the process while
 * the main thread sleeps until it is done (autograd runs the backward pass on a device thread
 * of its own while the main thread waits in backward()); pool:N:US has N threads each spin US
 * us at once while the main thread sleeps on them (a thread pool preparing a batch, numpy or a
 * native tokenizer with the GIL released).
 *
 * A report line: "unix_ms launches h2d h2d_bytes d2h d2h_bytes syncs copy_us sync_us cpu_us",
 * each a total since the start: the wall time spent in copies (call and synchronise), in other
 * synchronisations, and in the job's own CPU work (launch spins, cpu: and pool: ops, the pool's
 * wall time once).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
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

/* The job's tally: written by whichever thread made the call. */
static struct {
    unsigned long launches, h2d, d2h, syncs;
    unsigned long long h2d_bytes, d2h_bytes, copy_us, sync_us, cpu_us;
} tally;
#define ADD(field, n) __atomic_add_fetch(&tally.field, (n), __ATOMIC_RELAXED)
#define GET(field) __atomic_load_n(&tally.field, __ATOMIC_RELAXED)

static char buf[4];
static FILE *report;
static double next_report;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static unsigned long long since_us(double start) {
    return (unsigned long long)((now_s() - start) * 1e6);
}

static void spin_us(double us) {
    double end = now_s() + us / 1e6;
    while (now_s() < end) {
    }
}

static void write_report(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    fprintf(report, "%lld %lu %lu %llu %lu %llu %lu %llu %llu %llu\n",
            (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000, GET(launches), GET(h2d),
            GET(h2d_bytes), GET(d2h), GET(d2h_bytes), GET(syncs), GET(copy_us), GET(sync_us),
            GET(cpu_us));
    fflush(report);
}

static void maybe_report(void) {
    if (!report) return;
    double now = now_s();
    if (now < next_report) return;
    next_report = now + 0.02;
    write_report();
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "cuda_job: %s missing from libcuda.so.1\n", name);
        exit(2);
    }
    return p;
}

static void run(const char *op);

/* bg: one op on a second thread while the caller sleeps on it. */
static void *run_bg(void *op) {
    run((const char *)op);
    return NULL;
}

static void background(const char *op) {
    pthread_t t;
    if (pthread_create(&t, NULL, run_bg, (void *)op) != 0) exit(3);
    pthread_join(t, NULL);
}

/* pool: N threads each spinning US us at once. */
static void *spin_thread(void *us) {
    spin_us(*(double *)us);
    return NULL;
}

static void pool(unsigned long n, double us) {
    pthread_t t[64];
    if (n > 64) n = 64;
    double start = now_s();
    for (unsigned long i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, spin_thread, &us) != 0) exit(3);
    for (unsigned long i = 0; i < n; i++) pthread_join(t[i], NULL);
    ADD(cpu_us, since_us(start));
}

static void copy(int to_device, unsigned long n) {
    void *host = malloc(n ? n : 1);
    double start = now_s();
    if (to_device) h2d(0, host, n, 0);
    else d2h(host, 0, n, 0);
    stream_sync(0);
    ADD(copy_us, since_us(start));
    free(host);
    if (to_device) {
        ADD(h2d, 1);
        ADD(h2d_bytes, n);
    } else {
        ADD(d2h, 1);
        ADD(d2h_bytes, n);
    }
}

static void run(const char *op) {
    unsigned long n = 0;
    double us = 0;
    if (strncmp(op, "bg:", 3) == 0) {
        background(op + 3);
    } else if (sscanf(op, "pool:%lu:%lf", &n, &us) == 2) {
        pool(n, us);
    } else if (sscanf(op, "launch:%lu:%lf", &n, &us) >= 1 && strncmp(op, "launch:", 7) == 0) {
        for (unsigned long i = 0; i < n; i++) {
            if (us > 0) {
                double start = now_s();
                spin_us(us);
                ADD(cpu_us, since_us(start));
            }
            launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
            ADD(launches, 1);
            if ((i & 255) == 0) maybe_report();
        }
    } else if (sscanf(op, "h2d:%lu", &n) == 1) {
        copy(1, n);
    } else if (sscanf(op, "d2h:%lu", &n) == 1) {
        copy(0, n);
    } else if (strcmp(op, "item") == 0) {
        launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        d2h(buf, 0, 4, 0);
        double start = now_s();
        stream_sync(0);
        ADD(sync_us, since_us(start));
        ADD(launches, 1);
        ADD(d2h, 1);
        ADD(d2h_bytes, 4);
    } else if (strcmp(op, "sync") == 0) {
        double start = now_s();
        ctx_sync();
        ADD(sync_us, since_us(start));
        ADD(syncs, 1);
    } else if (sscanf(op, "hostfn:%lu", &n) == 1) {
        host_func(0, 0, (void *)(uintptr_t)n);
    } else if (sscanf(op, "cpu:%lf", &us) == 1) {
        double start = now_s();
        spin_us(us);
        ADD(cpu_us, since_us(start));
    } else {
        fprintf(stderr, "cuda_job: unknown op %s\n", op);
        exit(2);
    }
    maybe_report();
}

int main(int argc, char **argv) {
    const char *wait_for = NULL;
    double seconds = 0;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc) return 2;
        if (strcmp(argv[i], "--wait") == 0) wait_for = argv[i + 1];
        else if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--report") == 0) {
            report = fopen(argv[i + 1], "a");
            if (!report) {
                perror(argv[i + 1]);
                return 2;
            }
        } else return 2;
    }
    const char *path = getenv("CUDA_JOB_LIB");
    void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
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
    if (report) write_report();
    printf("done launches=%lu h2d=%lu h2d_bytes=%llu d2h=%lu d2h_bytes=%llu syncs=%lu\n",
           GET(launches), GET(h2d), GET(h2d_bytes), GET(d2h), GET(d2h_bytes), GET(syncs));
    fflush(stdout);
    for (;;) pause();
}
