// The zita-convolver side of `tess bench convolution`: INSTANCES convolvers of one IR_LEN-sample
// impulse response, each fed the same input, processed every BLOCK samples at 44.1 kHz by a
// SCHED_FIFO PRIO thread on HART for SECONDS. zita runs its partition levels on its own
// threads (one per level and instance) at PRIO-1 and below, pinned to the same hart: the same
// preparation as tess-conv's preemptive mode. Prints one JSON line: callbacks, late (process()
// reported a level late, plus convolvers zita stopped by itself), late_knock_ons (a level late in
// a callback the host made late or within LEVEL_KNOCK_ON callbacks after it: counted apart, the
// rule of `HostTail` in bench.rs), overruns (a callback ended
// after the next was due), late_wakeups, stalls and knock_ons (late callbacks that were the
// host's, counted apart by the same rule as `account` in bench.rs: the timer woke the idle thread
// more than half a period late; or one share of the callback took more than half a period while
// the kernel did not switch the thread out and the callback would have been in time without it;
// or the excused callback before it ended past its release and its own work took no more than a
// period), max_us.
//
// Built by the bench at run time: g++ -O2 harness.cc -lzita-convolver -lfftw3f -lpthread
#include <zita-convolver.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <vector>

// The calling thread's involuntary context switches so far: a change across a callback means
// the guest's kernel took the CPU from it, which is not the host's doing.
static long involuntary_switches() {
    rusage u;
    if (getrusage(RUSAGE_THREAD, &u) != 0) return -1;
    return u.ru_nivcsw;
}

// Callbacks after one the host made late within which a late level is that event's tail
// (LEVEL_KNOCK_ON in bench.rs).
static const long long LEVEL_KNOCK_ON = 4;

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s INSTANCES SECONDS HART PRIO IR_LEN BLOCK\n", argv[0]);
        return 2;
    }
    int instances = atoi(argv[1]);
    double seconds = atof(argv[2]);
    int hart = atoi(argv[3]);
    int prio = atoi(argv[4]);
    int ir_len = atoi(argv[5]);
    int block = atoi(argv[6]);

    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(hart, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) { perror("sched_setaffinity"); return 1; }
    if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) perror("mlockall (continuing)");

    // Decaying noise, like the Rust side's response (the content does not change the cost).
    std::vector<float> ir(ir_len);
    unsigned long long s = 12345;
    for (int i = 0; i < ir_len; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float r = (float)((s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
        ir[i] = r * expf(-6.9f * i / ir_len);
    }
    std::vector<Convproc *> conv;
    for (int i = 0; i < instances; i++) {
        Convproc *c = new Convproc;
        // What zita's users turn on (jconvolver -V -M, EasyEffects): its SIMD multiply-add and
        // measured FFTW plans.
        c->set_options(Convproc::OPT_VECTOR_MODE | Convproc::OPT_FFTW_MEASURE);
        int rc = c->configure(1, 1, ir_len, block, Convproc::MINPART, Convproc::MAXPART, 0.0f);
        if (rc) { fprintf(stderr, "configure failed: %d\n", rc); return 1; }
        rc = c->impdata_create(0, 0, 1, ir.data(), 0, ir_len);
        if (rc) { fprintf(stderr, "impdata_create failed: %d\n", rc); return 1; }
        rc = c->start_process(prio - 1, SCHED_FIFO);
        if (rc) { fprintf(stderr, "start_process failed: %d\n", rc); return 1; }
        conv.push_back(c);
    }
    sched_param sp;
    sp.sched_priority = prio;
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) { perror("sched_setscheduler"); return 1; }

    const long long period = (long long)block * 1000000000LL / 44100;
    const long long warmup = 200000000LL; // not counted: page faults, first FFTs
    std::vector<float> input(block);
    double sink = 0;
    long long callbacks = 0, late = 0, late_knock_ons = 0, overruns = 0, late_wakeups = 0, stalls = 0, knock_ons = 0,
              max_ns = 0, prev_done = 0;
    bool prev_excused = false; // the callback before was late by the host's doing
    long long since_excused = 1LL << 62; // callbacks since the last one the host made late
    long long start = now_ns() + 1000000, next = start;
    long long end = start + warmup + (long long)(seconds * 1e9);
    for (long long t = 0; next < end; t++) {
        timespec ts = {(time_t)(next / 1000000000LL), (long)(next % 1000000000LL)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
        long long woke = now_ns();
        long switches = involuntary_switches();
        for (int j = 0; j < block; j++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            input[j] = (float)((s >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
        }
        int late_now = 0;
        long long last = woke, longest = 0; // the longest share one instance took
        for (Convproc *c : conv) {
            memcpy(c->inpdata(0), input.data(), block * sizeof(float));
            int flags = c->process(false);
            if (flags & Convproc::FL_LATE) late_now = 1;
            sink += c->outdata(0)[0];
            long long now = now_ns();
            if (now - last > longest) longest = now - last;
            last = now;
        }
        long long done = now_ns();
        if (done - last > longest) longest = done - last; // the tail is a share too
        // only a late callback is judged, so only a late one pays for the second reading
        bool preempted = done > next + period && involuntary_switches() != switches;
        // the callback's end had its longest share taken as long as its others on average
        long long typical = (done - woke - longest) / (instances > 0 ? instances : 1);
        // the same verdicts as the Rust side (see account in bench.rs)
        enum { ON_TIME, LATE_WAKEUP, STALL, KNOCK_ON, OVERRUN } verdict = ON_TIME;
        if (done > next + period) {
            if (prev_done <= next && woke - next > period / 2) verdict = LATE_WAKEUP;
            else if (!preempted && longest > period / 2 && done - longest + typical <= next + period)
                verdict = STALL;
            else if (prev_excused && prev_done > next && !preempted && done - woke <= period)
                verdict = KNOCK_ON;
            else verdict = OVERRUN;
        }
        prev_excused = verdict == LATE_WAKEUP || verdict == STALL || verdict == KNOCK_ON;
        since_excused = prev_excused ? 0 : since_excused + 1;
        if (next >= start + warmup) {
            callbacks++;
            if (late_now && since_excused <= LEVEL_KNOCK_ON) late_knock_ons++;
            else late += late_now;
            late_wakeups += verdict == LATE_WAKEUP;
            stalls += verdict == STALL;
            knock_ons += verdict == KNOCK_ON;
            overruns += verdict == OVERRUN;
            if (overruns + late > 50) break; // failed beyond doubt (CLEARLY_FAILED in bench.rs)
            if (done - woke > max_ns) max_ns = done - woke;
        }
        prev_done = done;
        next += period;
        // a stall past a whole period: skip the missed periods, as an audio device does
        // after an xrun (the same rule as `account` in bench.rs)
        if (done > next + period) next += (done - next) / period * period;
    }
    // zita stops a convolver by itself after a run of late cycles (then process() does
    // nothing and reports nothing): a convolver not processing at the end is a failed run.
    long long stopped = 0;
    for (Convproc *c : conv) if (c->state() != Convproc::ST_PROC) stopped++;
    sp.sched_priority = 0;
    sched_setscheduler(0, SCHED_OTHER, &sp);
    for (Convproc *c : conv) { c->stop_process(); while (!c->check_stop()) usleep(1000); c->cleanup(); delete c; }
    printf("{\"stopped\":%lld,\"callbacks\":%lld,\"late\":%lld,\"late_knock_ons\":%lld,\"overruns\":%lld,\"late_wakeups\":%lld,"
           "\"stalls\":%lld,\"knock_ons\":%lld,\"max_us\":%.1f,\"sink\":%g}\n",
           stopped, callbacks, late + stopped, late_knock_ons, overruns, late_wakeups, stalls, knock_ons,
           max_ns / 1000.0, sink);
    return 0;
}
