/*
 * ping.c: a C peer of a tess channel.
 *
 * Usage: ping SOCKET_FD COUNT
 *
 * Receives one channel end over the Unix socket SOCKET_FD (inherited from the parent, which
 * plays the broker and the other peer), then sends COUNT messages "ping N" and expects each to
 * come back upper-cased ("PING N"). It also exercises the zero-copy calls (reserve/commit,
 * peek/release) and a batch send, then closes its end, which the peer sees as a hang-up.
 *
 * Build against libtess (docs/c-library.md): cc ping.c $(pkg-config --cflags --libs tess)
 * Exit status 0 on success; otherwise a message on stderr says what went wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tess_channel.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        int rc_ = (call);                                                              \
        if (rc_ != TESS_CHANNEL_OK) {                                                  \
            fprintf(stderr, "ping: %s failed: %s\n", #call, tess_channel_strerror(rc_)); \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

static int expect_upper(const char *sent, const char *got, size_t len) {
    if (strlen(sent) != len) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = sent[i];
        if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        if (got[i] != c) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ping SOCKET_FD COUNT\n");
        return 2;
    }
    int sock = atoi(argv[1]);
    long count = atol(argv[2]);

    tess_channel_t *ch = NULL;
    CHECK(tess_channel_recv_open(sock, &ch));
    CHECK(tess_channel_set_wait(ch, TESS_CHANNEL_WAIT_ADAPTIVE));
    size_t max = tess_channel_max_message_size(ch);
    char *buf = malloc(max);
    if (!buf) return 1;

    char msg[64];
    for (long i = 0; i < count; i++) {
        int n = snprintf(msg, sizeof msg, "ping %ld", i);
        CHECK(tess_channel_send(ch, msg, (size_t)n));
        size_t len = 0;
        CHECK(tess_channel_recv_timeout(ch, buf, max, &len, 5000000000ull));
        if (!expect_upper(msg, buf, len)) {
            fprintf(stderr, "ping: bad echo for '%s': '%.*s'\n", msg, (int)len, buf);
            return 1;
        }
    }

    /* Zero copy: write in place, read the echo in place. */
    void *slot = NULL;
    CHECK(tess_channel_reserve(ch, 16, -1, &slot));
    memcpy(slot, "zero copy", 9);
    CHECK(tess_channel_commit(ch, 9));
    const void *in = NULL;
    size_t in_len = 0;
    CHECK(tess_channel_peek(ch, 5000000000ll, &in, &in_len));
    if (!expect_upper("zero copy", in, in_len)) {
        fprintf(stderr, "ping: bad zero-copy echo\n");
        return 1;
    }
    CHECK(tess_channel_release(ch));

    /* A batch of three, echoed one by one. */
    tess_channel_msg_t batch[3] = {{"a", 1}, {"bb", 2}, {"ccc", 3}};
    size_t sent = 0;
    CHECK(tess_channel_try_send_batch(ch, batch, 3, &sent));
    if (sent != 3) {
        fprintf(stderr, "ping: batch sent %zu of 3\n", sent);
        return 1;
    }
    for (int i = 0; i < 3; i++) {
        size_t len = 0;
        CHECK(tess_channel_recv_timeout(ch, buf, max, &len, 5000000000ull));
        if (!expect_upper(batch[i].data, buf, len)) {
            fprintf(stderr, "ping: bad batch echo %d\n", i);
            return 1;
        }
    }

    int rc = tess_channel_try_recv(ch, buf, max, NULL);
    if (rc != TESS_CHANNEL_EAGAIN) {
        fprintf(stderr, "ping: expected an empty channel, got %s\n", tess_channel_strerror(rc));
        return 1;
    }
    tess_channel_close(ch);
    free(buf);
    printf("ping: %ld round trips ok\n", count);
    return 0;
}
