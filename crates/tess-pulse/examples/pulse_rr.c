/*
 * pulse_rr.c: the paper's Listing 2 (seed 004 section 4.2), a global round-robin scheduler
 * written against Pulse, in C. Run: ./pulse_rr [THREADS] [HARTS]
 *
 * THREADS threads each spin through a fixed amount of work without ever yielding; only
 * Pulse's timer tick (1 ms) takes a hart away from them, so every thread getting its turn
 * shows that preemption works. At the end the program prints one line per thread with the
 * number of distinct harts it ran on and the ticks that preempted it.
 *
 * Differences from the listing's pseudo-code, each for correctness:
 *  - tick/yield queue the thread the context belongs to (ctx->thread's context, where Pulse
 *    saved it); the listing copies into threads[vhart_id()], which another hart could
 *    overwrite before the copy is popped;
 *  - the queue is a ring of context pointers guarded by a pulse_lock_t (push_lock/pop_lock);
 *  - adapt copies the handed-over contexts into the threads' own context slots (as the
 *    listing does into its array) and queues them.
 *
 * Build against libtess (docs/c-library.md): cc pulse_rr.c $(pkg-config --cflags --libs tess)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include "tess_pulse.h"

#define MAX_THREADS 64
#define WORK 60000000ULL

static pulse_thread_t *threads[MAX_THREADS];
static pulse_ctx_t *queue[MAX_THREADS + 1];
static size_t q_head, q_tail;
static pulse_lock_t q_lock; /* zero-initialized = unlocked */
static atomic_int active_threads;
static atomic_int preemptions[MAX_THREADS];
static atomic_int last_hart[MAX_THREADS];
static atomic_int hart_changes[MAX_THREADS];
static int num_threads;

static void push(pulse_ctx_t *ctx) {
    queue[q_tail] = ctx;
    q_tail = (q_tail + 1) % (MAX_THREADS + 1);
}

static pulse_ctx_t *pop(void) {
    if (q_head == q_tail) return NULL;
    pulse_ctx_t *c = queue[q_head];
    q_head = (q_head + 1) % (MAX_THREADS + 1);
    return c;
}

static void push_lock(pulse_ctx_t *ctx) {
    pulse_lock_acquire(&q_lock);
    push(ctx);
    pulse_lock_release(&q_lock);
}

static pulse_ctx_t *pop_lock(void) {
    pulse_lock_acquire(&q_lock);
    pulse_ctx_t *c = pop();
    pulse_lock_release(&q_lock);
    return c;
}

static int index_of(pulse_ctx_t *ctx) {
    for (int i = 0; i < num_threads; i++)
        if (pulse_thread_ctx(threads[i]) == pulse_thread_ctx(ctx->thread)) return i;
    return -1;
}

static void run_next_thread(void) {
    while (atomic_load(&active_threads) > 0) {
        pulse_ctx_t *ctx = pop_lock();
        if (ctx != NULL) {
            int i = index_of(ctx);
            int h = vhart_id();
            if (i >= 0 && atomic_exchange(&last_hart[i], h) != h) atomic_fetch_add(&hart_changes[i], 1);
            pulse_ctx_restore_enable_ticks(ctx);
        }
        pulse_sched_ctx_done();
    }
}

static void enter(void) { run_next_thread(); }

static void tick(pulse_ctx_t *ctx) {
    int i = index_of(ctx);
    if (i >= 0) atomic_fetch_add(&preemptions[i], 1);
    push_lock(pulse_thread_ctx(ctx->thread));
    run_next_thread();
}

static void yield(pulse_ctx_t *ctx) {
    push_lock(pulse_thread_ctx(ctx->thread));
    run_next_thread();
}

static void done(void) {
    atomic_fetch_sub(&active_threads, 1);
    pulse_thread_free();
    run_next_thread();
}

static void adapt(size_t old_n, size_t new_n, pulse_ctx_t *ctx) {
    (void)new_n;
    if (vhart_id() != 0) return;
    for (size_t i = 0; i < old_n; i++) {
        if (ctx[i].thread == NULL) continue;
        pulse_ctx_t *own = pulse_thread_ctx(ctx[i].thread);
        pulse_ctx_copy(own, &ctx[i]);
        push(own);
    }
}

static void thread_func(void *arg) {
    volatile uint64_t x = (uint64_t)(uintptr_t)arg;
    for (uint64_t k = 0; k < WORK; k++) x = x * 6364136223846793005ULL + k; /* never yields */
}

static void init(int n, void (*func)(void *)) {
    q_head = q_tail = 0;
    for (int i = 0; i < n; i++) {
        threads[i] = pulse_thread_alloc(64 * 1024);
        if (threads[i] == NULL) { fprintf(stderr, "pulse_thread_alloc failed\n"); exit(1); }
        push(pulse_ctx_make(threads[i], func, (void *)(uintptr_t)i));
        atomic_store(&last_hart[i], -1);
    }
    atomic_store(&active_threads, n);
    num_threads = n;
    static const pulse_sched_t callbacks = {enter, tick, yield, done, adapt, NULL};
    pulse_sched_reg(&callbacks);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    int harts = argc > 2 ? atoi(argv[2]) : 2;
    if (n < 1 || n > MAX_THREADS || harts < 1) {
        fprintf(stderr, "usage: pulse_rr [THREADS 1..%d] [HARTS >= 1]\n", MAX_THREADS);
        return 2;
    }
    init(n, thread_func);
    int r = pulse_run((size_t)harts, 1000000);
    if (r != PULSE_OK) {
        fprintf(stderr, "pulse_run: %s\n", pulse_strerror(r));
        return 1;
    }
    int total = 0;
    for (int i = 0; i < n; i++) {
        printf("thread %d: preempted %d times, changed hart %d times\n", i,
               atomic_load(&preemptions[i]), atomic_load(&hart_changes[i]));
        total += atomic_load(&preemptions[i]);
    }
    printf("all %d threads done, %d preemptions\n", n, total);
    return 0;
}
