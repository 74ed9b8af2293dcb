/*
 * fake-cuda: a stand-in libcuda.so.1 for CI, as fake-nvml is for NVML. It exports the entry
 * points gpuwatch probes (and cuInit), so the uprobe path runs on the real kernel: discovery
 * through a container's mappings, attachment by inode, per-container counts, detach.
 *
 * What each behaviour copies (measured on an H100 host, driver 580.159.04, 2026-12-05, with
 * tracefs uprobes on the real library: tests/gpu/cuda_calls.py, tests/fixtures/cuda-calls-h100):
 *
 * - Launches are asynchronous: the call returns at once and the kernel runs on the "GPU" after
 *   the ones queued before it. FAKE_CUDA_KERNEL_US (default 2.7) is each kernel's GPU time: a
 *   one-element kernel loop kept the H100 busy 31 % at 116,000 launches a second (2.7 us each).
 *   The driver's own share of a launch's host time was not measured apart from PyTorch's
 *   (7.5 us a launch in all): the call itself costs nothing here, and a job that wants the
 *   host time of an eager launch spins for it itself (cuda_job.c).
 * - A host-to-device or device-to-host copy from pageable memory holds the calling thread
 *   while the driver stages it: FAKE_CUDA_COPY_GBPS (default 8.2) is the rate, from a 256-MiB
 *   `tensor.to("cuda")` taking 32.8 ms, call and stream synchronise together. The copy waits
 *   for the work queued before it (the driver synchronises the stream first for pageable
 *   memory). Device-to-device copies are queued like kernels (4 x 64 MiB took 0.6 ms).
 * - A synchronise (stream, context, event) returns once the queued work is done, spinning
 *   until then: PyTorch's default (cudaDeviceScheduleAuto with one context) spins. On the H100
 *   host `.item()` and an event's synchronize() waiting 1.985 s for a kernel took 1.984 and
 *   1.985 s of their thread's CPU (tests/gpu/busy_and_sync.py). FAKE_CUDA_SYNC=sleep sleeps
 *   instead, as cudaDeviceScheduleBlockingSync does.
 * - cuLaunchHostFunc queues a host function the stream waits for: the job's sync scenario
 *   (usleep(8000) on the real driver's callback thread); here its argument is the microseconds
 *   the stream is held.
 *
 * Everything returns CUDA_SUCCESS (0). One "GPU" queue per process.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void *CUstream;

static double kernel_us = 2.7;
static double copy_gbps = 8.2;
static int sync_sleeps;
static uint64_t queue_until_ns; /* when the work queued so far is done */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

__attribute__((constructor)) static void configure(void) {
    const char *k = getenv("FAKE_CUDA_KERNEL_US");
    const char *c = getenv("FAKE_CUDA_COPY_GBPS");
    const char *y = getenv("FAKE_CUDA_SYNC");
    if (k) kernel_us = atof(k);
    if (c) copy_gbps = atof(c);
    sync_sleeps = y && strcmp(y, "sleep") == 0;
}

static void queue(double us) {
    uint64_t now = now_ns();
    if (queue_until_ns < now) queue_until_ns = now;
    queue_until_ns += (uint64_t)(us * 1000.0);
}

static void sleep_until(uint64_t t) {
    uint64_t now = now_ns();
    if (t <= now) return;
    struct timespec d = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
    nanosleep(&d, NULL);
}

static void spin_for(uint64_t ns) {
    uint64_t end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

static CUresult sync_queue(void) {
    if (sync_sleeps) {
        sleep_until(queue_until_ns);
    } else {
        uint64_t now = now_ns();
        if (queue_until_ns > now) spin_for(queue_until_ns - now);
    }
    return 0;
}

/* Staging a pageable copy: the queue drains first, then the thread copies at copy_gbps. */
static CUresult pageable_copy(size_t bytes) {
    sync_queue();
    spin_for((uint64_t)((double)bytes / copy_gbps));
    return 0;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s;
    (void)params; (void)extra;
    queue(kernel_us);
    return 0;
}
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra;
    queue(kernel_us);
    return 0;
}
CUresult cuGraphLaunch(void *graph, CUstream s) { (void)graph; (void)s; queue(kernel_us * 10); return 0; }

CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { (void)dst; (void)src; return pageable_copy(n); }
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, CUstream s) {
    (void)dst; (void)src; (void)s;
    return pageable_copy(n);
}
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { (void)dst; (void)src; return pageable_copy(n); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, CUstream s) {
    (void)dst; (void)src; (void)s;
    return pageable_copy(n);
}
CUresult cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, CUstream s) {
    (void)dst; (void)src; (void)s;
    /* 4 x 64 MiB in 0.6 ms on the H100: ~450 GB/s */
    queue((double)n / 450e3);
    return 0;
}

CUresult cuStreamSynchronize(CUstream s) { (void)s; return sync_queue(); }
CUresult cuCtxSynchronize(void) { return sync_queue(); }
CUresult cuCtxSynchronize_v2(void) { return sync_queue(); }
CUresult cuEventSynchronize(void *e) { (void)e; return sync_queue(); }

CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *us) {
    (void)s; (void)fn;
    queue((double)(uintptr_t)us);
    return 0;
}
