/* Drives the C ABI from plain C: bad input of every kind must return the named status
 * with a message, never crash; a world-size-1 group then exercises the happy path.
 * Usage: abi_errors <tcp port>. Prints one line per check; exits 1 on the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pybridge.h"

static int failures = 0;

static void expect(const char *what, int got, int want) {
    const char *msg = pb_last_error();
    if (got != want) {
        printf("FAIL %s: got %s want %s (%s)\n", what, pb_status_name(got), pb_status_name(want), msg);
        failures++;
    } else if (want != PB_OK && (msg == NULL || msg[0] == '\0')) {
        printf("FAIL %s: %s with an empty message\n", what, pb_status_name(got));
        failures++;
    } else {
        printf("ok   %s -> %s%s%s\n", what, pb_status_name(got), want ? ": " : "", want ? msg : "");
    }
}

static void check(const char *what, int ok) {
    if (!ok) {
        printf("FAIL %s\n", what);
        failures++;
    } else {
        printf("ok   %s\n", what);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s PORT\n", argv[0]); return 2; }
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[1]);
    float data[4] = {1, 2, 3, 4};
    pb_tensor t = {data, 4, PB_FLOAT32, PB_CPU};
    pb_group *g = NULL;
    pb_work *w = NULL;
    pb_buffer *b = NULL;
    int32_t v = 0;

    check("error message before any call is empty", pb_last_error()[0] == '\0');
    /* Calls before init. */
    expect("all_reduce before init", pb_all_reduce(NULL, &t, PB_SUM), PB_ERR_NOT_INITIALIZED);
    expect("barrier before init", pb_barrier(NULL), PB_ERR_NOT_INITIALIZED);
    expect("rank before init", pb_rank(NULL, &v), PB_ERR_NOT_INITIALIZED);
    expect("finalize of NULL", pb_finalize(NULL), PB_ERR_INVALID_ARGUMENT);
    /* Bad init arguments. */
    expect("init with NULL out", pb_init(url, "gloo", 0, 1, 0, 5, NULL), PB_ERR_INVALID_ARGUMENT);
    expect("init with unknown backend", pb_init(url, "mpi-ish", 0, 1, 0, 5, &g), PB_ERR_INVALID_ARGUMENT);
    expect("init with rank >= world", pb_init(url, "gloo", 3, 2, 0, 5, &g), PB_ERR_INVALID_ARGUMENT);
    expect("init with bad scheme", pb_init("http://x", "gloo", 0, 1, 0, 5, &g), PB_ERR_INVALID_ARGUMENT);
    /* A real group of one. */
    expect("init", pb_init(url, "gloo", 0, 1, 0, 10, &g), PB_OK);
    if (failures) return 1; /* the checks below need this step */
    expect("second init", pb_init(url, "gloo", 0, 1, 0, 10, &g), PB_ERR_ALREADY_INITIALIZED);
    expect("rank", pb_rank(g, &v), PB_OK);
    check("rank is 0", v == 0);
    expect("size", pb_size(g, &v), PB_OK);
    check("size is 1", v == 1);
    expect("device", pb_device(g, &v), PB_OK);
    check("device is CPU", v == PB_CPU);
    expect("rank with NULL out", pb_rank(g, NULL), PB_ERR_INVALID_ARGUMENT);
    expect("all_reduce sum", pb_all_reduce(g, &t, PB_SUM), PB_OK);
    check("all_reduce over one rank leaves data", data[3] == 4.0f);
    /* Bad collective arguments. */
    pb_tensor bad = t;
    expect("NULL descriptor", pb_all_reduce(g, NULL, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    bad.data = NULL;
    expect("NULL data with count 4", pb_all_reduce(g, &bad, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    bad = t; bad.count = -3;
    expect("negative count", pb_all_reduce(g, &bad, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    bad = t; bad.dtype = 42;
    expect("unknown dtype", pb_all_reduce(g, &bad, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    bad = t; bad.device = -7;
    expect("bad device", pb_all_reduce(g, &bad, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    bad = t; bad.device = 0;
    expect("CUDA device without CUDA", pb_all_reduce(g, &bad, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    expect("unknown op", pb_all_reduce(g, &t, 99), PB_ERR_INVALID_ARGUMENT);
    int32_t ints[2] = {1, 2};
    pb_tensor it = {ints, 2, PB_INT32, PB_CPU};
    /* A call that succeeded before (and was prepared once) must not let a bad op or root
     * for the same buffer through. */
    expect("sum on integers", pb_all_reduce(g, &it, PB_SUM), PB_OK);
    expect("avg on integers", pb_all_reduce(g, &it, PB_AVG), PB_ERR_INVALID_ARGUMENT);
    expect("broadcast from root 0", pb_broadcast(g, &t, 0), PB_OK);
    expect("broadcast root out of range", pb_broadcast(g, &t, 1), PB_ERR_INVALID_ARGUMENT);
    expect("broadcast from root 0 again", pb_broadcast(g, &t, 0), PB_OK);
    expect("broadcast negative root", pb_broadcast(g, &t, -1), PB_ERR_INVALID_ARGUMENT);
    float out[3];
    pb_tensor small = {out, 3, PB_FLOAT32, PB_CPU};
    expect("all_gather size mismatch", pb_all_gather(g, &t, &small), PB_ERR_INVALID_ARGUMENT);
    pb_tensor o_int = {ints, 2, PB_INT32, PB_CPU};
    pb_tensor two = {data, 2, PB_FLOAT32, PB_CPU};
    expect("reduce_scatter dtype mismatch", pb_reduce_scatter(g, &two, &o_int, PB_SUM), PB_ERR_INVALID_ARGUMENT);
    expect("send to self", pb_send(g, &t, 0, 0), PB_ERR_INVALID_ARGUMENT);
    expect("recv from self", pb_recv(g, &t, 0, 1), PB_ERR_INVALID_ARGUMENT);
    /* Foreign and stale handles. */
    expect("foreign group handle", pb_barrier((pb_group *)data), PB_ERR_INVALID_ARGUMENT);
    expect("foreign work handle", pb_work_wait((pb_work *)0x1234, 1), PB_ERR_INVALID_ARGUMENT);
    expect("buffer with unknown dtype", pb_buffer_new(99, 4, PB_CPU, &b), PB_ERR_INVALID_ARGUMENT);
    expect("buffer with negative count", pb_buffer_new(PB_FLOAT32, -1, PB_CPU, &b), PB_ERR_INVALID_ARGUMENT);
    expect("buffer new", pb_buffer_new(PB_FLOAT64, 3, PB_CPU, &b), PB_OK);
    pb_tensor bt;
    expect("buffer tensor", pb_buffer_tensor(b, &bt), PB_OK);
    if (failures) return 1; /* the checks below need this step */
    check("buffer is 3 zeroed float64", bt.count == 3 && bt.dtype == PB_FLOAT64 && ((double *)bt.data)[0] == 0.0);
    ((double *)bt.data)[2] = 7.5;
    expect("all_reduce_async", pb_all_reduce_async(g, b, PB_MAX, &w), PB_OK);
    expect("work wait", pb_work_wait(w, 5), PB_OK);
    int32_t done = 0;
    expect("work test", pb_work_test(w, &done), PB_OK);
    check("work done", done == 1);
    check("buffer kept value", ((double *)bt.data)[2] == 7.5);
    expect("work close", pb_work_close(w), PB_OK);
    expect("work wait after close", pb_work_wait(w, 1), PB_ERR_INVALID_ARGUMENT);
    expect("work close twice", pb_work_close(w), PB_ERR_INVALID_ARGUMENT);
    /* pb_work_free, deprecated, is the same function: the closed handle is unknown to it. */
    expect("work free after close", pb_work_free(w), PB_ERR_INVALID_ARGUMENT);
    expect("buffer free (deprecated name)", pb_buffer_free(b), PB_OK);
    expect("buffer close after free", pb_buffer_close(b), PB_ERR_INVALID_ARGUMENT);
    expect("async on closed buffer", pb_all_reduce_async(g, b, PB_SUM, &w), PB_ERR_INVALID_ARGUMENT);
    expect("barrier", pb_barrier(g), PB_OK);
    expect("finalize", pb_finalize(g), PB_OK);
    expect("use after finalize", pb_all_reduce(g, &t, PB_SUM), PB_ERR_CLOSED);
    expect("finalize twice", pb_finalize(g), PB_OK);
    check("status name", strcmp(pb_status_name(PB_ERR_TIMEOUT), "PB_ERR_TIMEOUT") == 0);
    check("unknown status name", strcmp(pb_status_name(12345), "PB_UNKNOWN") == 0);
    check("version", strcmp(pb_version(), "0.1.0") == 0);
    printf("abi_errors: %d failed checks\n", failures);
    return failures ? 1 : 0;
}
