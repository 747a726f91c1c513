/*
 * umbrella.c: a program that includes only tess.h and calls into each of its five headers,
 * built by tests/library.rs with `pkg-config --cflags --libs tess`, once against libtess.so
 * and once against libtess.a. Prints one line per part; exit status 0 when every part answers.
 */
#include <stdio.h>
#include <string.h>

#include "tess.h"

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "umbrella: %s failed (line %d)\n", #cond, __LINE__);    \
            return 1;                                                               \
        }                                                                           \
    } while (0)

int main(void) {
    /* tess_channel.h: one channel, both ends in this process, one message across. */
    tess_channel_fds_t a, b;
    CHECK(tess_channel_create(NULL, &a, &b) == TESS_CHANNEL_OK);
    tess_channel_t *ca = NULL, *cb = NULL;
    CHECK(tess_channel_open(&a, &ca) == TESS_CHANNEL_OK);
    CHECK(tess_channel_open(&b, &cb) == TESS_CHANNEL_OK);
    CHECK(tess_channel_send(ca, "hello", 5) == TESS_CHANNEL_OK);
    char buf[16];
    size_t len = 0;
    CHECK(tess_channel_recv(cb, buf, sizeof buf, &len) == TESS_CHANNEL_OK);
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0);
    tess_channel_close(ca);
    tess_channel_close(cb);
    printf("channel: hello across\n");

    /* tess_ns.h: without tessd only the error names answer. */
    printf("ns: %s\n", tess_ns_strerror(TESS_NS_ENOTFOUND));

    /* tess_runtime.h: the runtime's clock. */
    uint64_t t0 = tess_rt_now_ns();
    CHECK(t0 > 0 && tess_rt_now_ns() >= t0);
    printf("runtime: %s\n", tess_rt_strerror(TESS_RT_EINVAL));

    /* tess_heartbeat.h: a heartbeat without a name is refused. */
    tess_heartbeat_t *hb = NULL;
    CHECK(tess_heartbeat_register(NULL, 0, &hb) == TESS_HEARTBEAT_EINVAL && hb == NULL);
    printf("heartbeat: refused a nameless heartbeat\n");

    /* tess_pulse.h: a scheduler without callbacks is refused. */
    CHECK(pulse_sched_reg(NULL) == PULSE_EINVAL);
    printf("pulse: %s\n", pulse_strerror(PULSE_EINVAL));
    return 0;
}
