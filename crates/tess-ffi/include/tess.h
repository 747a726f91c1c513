/*
 * tess.h: the C library of tess (libtess), every header in one include.
 *
 *   tess_channel.h    lock-free shared-memory channels between cells
 *   tess_ns.h         the nameserver: register a service by name, connect to one
 *   tess_runtime.h    the cell runtime: one thread per hart, gang-scheduled windows, adapt
 *   tess_heartbeat.h  heartbeats with performance targets, read by the resource broker
 *   tess_pulse.h      Pulse: preemptive user-level threads and schedulers inside a cell
 *
 * Compile and link with pkg-config (docs/c-library.md):
 *   cc prog.c $(pkg-config --cflags --libs tess)
 * From the build tree, after `cargo build -p tess-ffi`:
 *   cc prog.c $(PKG_CONFIG_PATH=target/debug/pkgconfig pkg-config --cflags --libs tess)
 *
 * Each header can also be included on its own; all of them are in the one libtess.
 */
#ifndef TESS_H
#define TESS_H

#include "tess_channel.h"
#include "tess_ns.h"
#include "tess_runtime.h"
#include "tess_heartbeat.h"
#include "tess_pulse.h"

#endif /* TESS_H */
