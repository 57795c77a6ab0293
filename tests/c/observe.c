/* Observability from plain C, as one rank of two: with recording off every call does nothing
 * and returns PB_OK; pb_observe_start before pb_init records from there; the program's spans,
 * instants, scalars and steps, collectives and a reducer end up in the rank's files (checked
 * by tests/test_capi_observe.py); bad input is PB_ERR_INVALID_ARGUMENT naming the problem in
 * C's words. Usage: observe RANK PORT DIR. Prints "observe: N failed checks"; exits 0 when N
 * is 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pybridge.h"
#include "expect.h"

#define STEPS 3 /* training steps, each ended by pb_step_end */

static void expect_value(const char *what, long long got, long long want) {
    if (got != want) {
        printf("FAIL %s: got %lld, want %lld\n", what, got, want);
        failures++;
    } else {
        printf("ok   %s = %lld\n", what, got);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s RANK PORT DIR\n", argv[0]); return 2; }
    int rank = atoi(argv[1]);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[2]);
    int on = -1;
    int64_t span = -1, steps = -1;

    /* Off: no-ops, PB_OK, span id 0; NULL pointers are still refused. */
    expect("enabled (off)", pb_observe_enabled(&on), PB_OK, NULL);
    expect_value("enabled before start", on, 0);
    expect("span_begin (off)", pb_span_begin("off", NULL, &span), PB_OK, NULL);
    expect_value("span id when off", span, 0);
    expect("span_end 0", pb_span_end(span), PB_OK, NULL);
    expect("instant (off)", pb_instant("off", "user"), PB_OK, NULL);
    expect("log_scalar (off)", pb_log_scalar("off", 1.0, -1), PB_OK, NULL);
    expect("step_end (off)", pb_step_end(&steps), PB_OK, NULL);
    expect_value("steps when off", steps, 0);
    expect("flush (off)", pb_observe_flush(), PB_OK, NULL);
    expect("span_begin NULL name (off)", pb_span_begin(NULL, NULL, &span), PB_ERR_INVALID_ARGUMENT,
           "pb_span_begin: name is NULL");
    expect("span_begin NULL out", pb_span_begin("x", NULL, NULL), PB_ERR_INVALID_ARGUMENT,
           "pb_span_begin: out_span (the pointer to store the span's id in) is NULL");
    expect("enabled NULL out", pb_observe_enabled(NULL), PB_ERR_INVALID_ARGUMENT, "pb_observe_enabled: out is NULL");

    /* Bad starts. */
    expect("start with nothing", pb_observe_start(NULL, -1), PB_ERR_INVALID_ARGUMENT,
           "pb_observe_start: nothing to record into: trace_dir is NULL or empty and metrics_port < 0");
    expect("start with \"\"", pb_observe_start("", -5), PB_ERR_INVALID_ARGUMENT, "trace_dir is NULL or empty");
    expect("start with port 70000", pb_observe_start(argv[3], 70000), PB_ERR_INVALID_ARGUMENT,
           "pb_observe_start: the metrics port must be 0..65535, got 70000");

    /* On from pb_init. */
    expect("start", pb_observe_start(argv[3], -1), PB_OK, NULL);
    expect("enabled", pb_observe_enabled(&on), PB_OK, NULL);
    expect_value("enabled before pb_init", on, 0);
    pb_group *g = NULL;
    expect("init", pb_init(url, "gloo", rank, 2, rank, 30, &g), PB_OK, NULL);
    if (g == NULL) { printf("observe: %d failed checks\n", failures + 1); return 1; }
    expect("enabled", pb_observe_enabled(&on), PB_OK, NULL);
    expect_value("enabled after pb_init", on, 1);

    int64_t counts[] = {8};
    int32_t dtypes[] = {PB_FLOAT32};
    pb_reducer *r = NULL;
    expect("reducer", pb_reducer_create(g, 1, counts, dtypes, NULL, &r), PB_OK, NULL);
    for (int s = 0; s < STEPS; s++) {
        int64_t step_span = 0, fwd = 0, bwd = 0;
        expect("span train_step", pb_span_begin("train_step", NULL, &step_span), PB_OK, NULL);
        expect("span forward", pb_span_begin("forward", "forward", &fwd), PB_OK, NULL);
        float x[4] = {1, 2, 3, (float)rank};
        pb_tensor t = {x, 4, PB_FLOAT32, PB_CPU};
        expect("all_reduce", pb_all_reduce(g, &t, PB_SUM), PB_OK, NULL);
        expect("end forward", pb_span_end(fwd), PB_OK, NULL);
        expect("span backward", pb_span_begin("backward", "compute", &bwd), PB_OK, NULL);
        pb_tensor grad;
        expect("grad", pb_reducer_grad(r, 0, &grad), PB_OK, NULL);
        for (int i = 0; i < 8; i++) ((float *)grad.data)[i] = (float)(rank + s);
        expect("mark_ready", pb_reducer_mark_ready(r, 0), PB_OK, NULL);
        expect("end backward", pb_span_end(bwd), PB_OK, NULL);
        expect("wait", pb_reducer_wait(r, 30), PB_OK, NULL);
        expect("log loss", pb_log_scalar("loss", 1.5 + s + 0.25 * rank, -1), PB_OK, NULL);
        expect("end train_step", pb_span_end(step_span), PB_OK, NULL);
        expect("step_end", pb_step_end(&steps), PB_OK, NULL);
        /* the first reducer iteration's step is the one the first pb_step_end ends */
        expect_value("steps ended", steps, s + 1);
    }
    expect("log accuracy at step 7", pb_log_scalar("accuracy", 0.875, 7), PB_OK, NULL);
    expect("instant", pb_instant("epoch_end", "user"), PB_OK, NULL);
    expect("barrier", pb_barrier(g), PB_OK, NULL);

    /* Bad input while recording. */
    expect("span_begin NULL name", pb_span_begin(NULL, "user", &span), PB_ERR_INVALID_ARGUMENT,
           "pb_span_begin: name is NULL");
    expect("span_begin empty name", pb_span_begin("", "user", &span), PB_ERR_INVALID_ARGUMENT,
           "pb_span_begin: span name must be a non-empty string");
    expect("span_begin unknown category", pb_span_begin("x", "gpu", &span), PB_ERR_INVALID_ARGUMENT,
           "pb_span_begin: unknown span category 'gpu'; valid: user, compute, forward, data, comm");
    expect("instant NULL name", pb_instant(NULL, NULL), PB_ERR_INVALID_ARGUMENT, "pb_instant: name is NULL");
    expect("instant unknown category", pb_instant("x", "bogus"), PB_ERR_INVALID_ARGUMENT,
           "pb_instant: unknown span category 'bogus'");
    expect("log_scalar NULL name", pb_log_scalar(NULL, 1.0, -1), PB_ERR_INVALID_ARGUMENT,
           "pb_log_scalar: name is NULL");
    expect("log_scalar NaN", pb_log_scalar("loss", NAN, -1), PB_ERR_INVALID_ARGUMENT,
           "pb_log_scalar: scalar 'loss': expected a number, got nan");
    int64_t twice = 0;
    expect("span to end twice", pb_span_begin("twice", NULL, &twice), PB_OK, NULL);
    expect("end once", pb_span_end(twice), PB_OK, NULL);
    char want[96];
    snprintf(want, sizeof want, "pb_span_end: span %lld is not open (ended already, or never begun)",
             (long long)twice);
    expect("end twice", pb_span_end(twice), PB_ERR_INVALID_ARGUMENT, want);
    expect("end a span never begun", pb_span_end(123456), PB_ERR_INVALID_ARGUMENT, "span 123456 is not open");
    expect("flush", pb_observe_flush(), PB_OK, NULL);

    expect("reducer close", pb_reducer_close(r), PB_OK, NULL);
    expect("finalize", pb_finalize(g), PB_OK, NULL);
    expect("enabled after pb_finalize", pb_observe_enabled(&on), PB_OK, NULL);
    expect_value("still recording after pb_finalize", on, 1);
    printf("observe: %d failed checks\n", failures);
    return failures != 0;
}
