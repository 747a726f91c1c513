/*
 * ns_echo.c: find a peer by name through the tess nameserver, from C.
 *
 *   ns_echo serve NAME [UID...]   register NAME (admitting the listed uids), serve one client:
 *                                 echo each message upper-cased until it hangs up
 *   ns_echo ping NAME COUNT       connect to NAME, send COUNT messages "ping N", expect "PING N"
 *
 * Build against libtess (docs/c-library.md): cc ns_echo.c $(pkg-config --cflags --libs tess)
 * Exit status: 0 on success, 4 if the service refused us, 5 if no such service, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tess_channel.h"
#include "tess_ns.h"

static int ns_exit(const char *what, int rc) {
    fprintf(stderr, "ns_echo: %s: %s (%s)\n", what, tess_ns_strerror(rc), tess_ns_last_error());
    if (rc == TESS_NS_EPERM) return 4;
    if (rc == TESS_NS_ENOTFOUND) return 5;
    return 1;
}

static int serve(const char *name, int argc, char **argv) {
    uint32_t uids[16];
    size_t n = 0;
    for (int i = 0; i < argc && n < 16; i++) uids[n++] = (uint32_t)strtoul(argv[i], NULL, 10);
    tess_ns_service_t *svc = NULL;
    int rc = tess_ns_register(name, 0, uids, n, NULL, 0, 1024, &svc);
    if (rc != TESS_NS_OK) return ns_exit("register", rc);
    printf("ready\n");
    fflush(stdout);
    tess_channel_t *ch = NULL;
    tess_ns_peer_t peer;
    rc = tess_ns_accept(svc, &ch, &peer);
    if (rc != TESS_NS_OK) return ns_exit("accept", rc);
    fprintf(stderr, "ns_echo: client pid %d uid %u cell '%s'\n", peer.pid, peer.uid, peer.cell);
    char buf[1024];
    for (;;) {
        size_t len = 0;
        int r = tess_channel_recv(ch, buf, sizeof buf, &len);
        if (r != TESS_CHANNEL_OK) break; /* the client hung up */
        for (size_t i = 0; i < len; i++)
            if (buf[i] >= 'a' && buf[i] <= 'z') buf[i] = (char)(buf[i] - 'a' + 'A');
        if (tess_channel_send(ch, buf, len) != TESS_CHANNEL_OK) break;
    }
    tess_channel_close(ch);
    tess_ns_close(svc);
    return 0;
}

static int ping(const char *name, long count) {
    tess_channel_t *ch = NULL;
    int rc = tess_ns_connect(name, &ch);
    if (rc != TESS_NS_OK) return ns_exit("connect", rc);
    char msg[64], got[64], want[64];
    for (long i = 0; i < count; i++) {
        int n = snprintf(msg, sizeof msg, "ping %ld", i);
        if (tess_channel_send(ch, msg, (size_t)n) != TESS_CHANNEL_OK) { fprintf(stderr, "ns_echo: send failed\n"); return 1; }
        size_t len = 0;
        int r = tess_channel_recv(ch, got, sizeof got, &len);
        if (r != TESS_CHANNEL_OK) { fprintf(stderr, "ns_echo: recv: %s\n", tess_channel_strerror(r)); return 1; }
        snprintf(want, sizeof want, "PING %ld", i);
        if (len != strlen(want) || memcmp(got, want, len) != 0) { fprintf(stderr, "ns_echo: bad echo\n"); return 1; }
    }
    tess_channel_close(ch);
    printf("ok %ld\n", count);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "serve") == 0) return serve(argv[2], argc - 3, argv + 3);
    if (argc == 4 && strcmp(argv[1], "ping") == 0) return ping(argv[2], strtol(argv[3], NULL, 10));
    fprintf(stderr, "usage: ns_echo serve NAME [UID...] | ns_echo ping NAME COUNT\n");
    return 2;
}
