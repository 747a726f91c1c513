/*
 * gang.c: a gang-scheduled C program on the tess cell runtime.
 *
 * Usage: gang [SECONDS] [--standalone]
 *
 * In a 2-hart time-triggered cell (`tess run --cell gang -- ./gang 10`) every hart runs
 * window_work() at the same instant of every window; the program prints each virtual hart
 * id when it starts and "adapt(OLD -> NEW)" when `tess cell resize` shrinks or grows the cell,
 * and stops after SECONDS. With --standalone it runs 2 harts without tessd on a 10 ms / 2 ms
 * grid and resizes itself to 1 hart and back, the way tessd would.
 *
 * Build against libtess (docs/c-library.md): cc gang.c $(pkg-config --cflags --libs tess)
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tess_runtime.h"

#define MAX_HARTS 64

struct program {
    uint64_t started_ns;
    uint64_t seconds;
    atomic_uint_fast64_t windows[MAX_HARTS]; /* per vhart, since it (re)started */
    atomic_uint adaptations;
    unsigned resizes_asked; /* standalone: resizes requested so far (vhart 0 only) */
};

static void window_work(void *arg, const tess_rt_hart_t *hart) {
    struct program *p = arg;
    int64_t v = tess_rt_hart_vhart_id(hart);
    if (v < 0 || v >= MAX_HARTS) return;
    tess_rt_window_t w;
    int timed = tess_rt_hart_window(hart, &w);
    if (atomic_fetch_add(&p->windows[v], 1) == 0) {
        printf("vhart %" PRId64 " on hart %" PRId64 " started at window %" PRIu64 " (%zu harts)\n",
               v, tess_rt_hart_cpu(hart), timed ? w.index : 0, tess_rt_hart_count(hart));
        fflush(stdout);
    }
    /* The window's work: a little arithmetic. */
    volatile uint64_t x = (uint64_t)v;
    for (int i = 0; i < 2000; i++) x = x * 31 + (uint64_t)i;

    if (v != 0) return;
    uint64_t elapsed = tess_rt_now_ns() - p->started_ns;
    uint64_t total = p->seconds * 1000000000ull;
    int done = 1;
    if (tess_rt_is_standalone(hart)) {
        /* Resize ourselves as tessd would: to 1 hart after a third of the run, back to 2 after
         * two thirds. Each step is asked for once, after the previous adaptation completed (a
         * second request made while the first is in progress would be an adaptation of its
         * own), and the run lasts until both happened (at most a minute more), so a loaded
         * machine slows the script down instead of skipping a step. */
        uint64_t adapted = tess_rt_adaptations(hart);
        if (elapsed > total / 3 && p->resizes_asked == 0) {
            tess_rt_resize(hart, 1);
            p->resizes_asked = 1;
        } else if (elapsed > 2 * total / 3 && p->resizes_asked == 1 && adapted == 1) {
            tess_rt_resize(hart, 2);
            p->resizes_asked = 2;
        }
        done = adapted >= 2 || elapsed > total + 60000000000ull;
    }
    if (elapsed > total && done) tess_rt_stop(hart);
}

static void on_adapt(void *arg, size_t old_n, size_t new_n) {
    struct program *p = arg;
    for (size_t v = new_n; v < old_n && v < MAX_HARTS; v++) atomic_store(&p->windows[v], 0);
    atomic_fetch_add(&p->adaptations, 1);
    printf("adapt(%zu -> %zu)\n", old_n, new_n);
    fflush(stdout);
}

int main(int argc, char **argv) {
    static struct program p;
    p.seconds = 10;
    tess_rt_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--standalone") == 0) {
            cfg.standalone_harts = 2;
            cfg.period_ns = 10000000;
            cfg.active_ns = 2000000;
        } else {
            p.seconds = strtoull(argv[i], NULL, 10);
        }
    }
    p.started_ns = tess_rt_now_ns();
    int rc = tess_rt_run_per_window(&cfg, window_work, on_adapt, &p);
    if (rc != TESS_RT_OK) {
        fprintf(stderr, "gang: %s\n", tess_rt_strerror(rc));
        return 1;
    }
    printf("gang: done after %u adaptations\n", atomic_load(&p.adaptations));
    return 0;
}
