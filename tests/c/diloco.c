/* DiLoCo from C (tests/test_capi_diloco.py): the runs of tests/diloco_parity.py through
 * pb_diloco_*, whose weights the test compares with the Python DiLoCo's, and bad input named
 * by status and message. Usage: diloco RANK PORT WORLD. Prints "weights NAME: ..." and
 * "synced NAME: ..." per run, then "diloco: N failed checks". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "pybridge.h"
#include "expect.h"

#define NT 4
#define STEPS 12
static const int64_t SIZES[NT] = {35, 5, 15, 3};
static float model[NT][35];
static pb_tensor params[NT];

/* tests/diloco_parity.py's initial() and inner_step(), in float32. */
static void start(void) {
    for (int i = 0; i < NT; i++) {
        for (int j = 0; j < SIZES[i]; j++) model[i][j] = (float)((i * 13 + j * 7) % 17 - 8) * 0.05f;
        params[i] = (pb_tensor){model[i], SIZES[i], PB_FLOAT32, PB_CPU};
    }
}

static void inner_step(int rank, int step) {
    for (int i = 0; i < NT; i++)
        for (int j = 0; j < SIZES[i]; j++) {
            float target = (float)((rank * 7 + step * 3 + i * 5 + j) % 11 - 5) * 0.1f;
            model[i][j] -= 0.25f * (model[i][j] - target);
        }
}

/* One run: STEPS inner steps, pb_diloco_step after each. */
static void run(pb_group *g, int rank, const char *name, int32_t sync_every, const pb_diloco_options *o) {
    start();
    pb_diloco *d = NULL;
    char what[64];
    snprintf(what, sizeof what, "create %s", name);
    expect(what, pb_diloco_create(g, NT, params, sync_every, o, &d), PB_OK, NULL);
    if (!d) return;
    printf("synced %s:", name);
    for (int t = 1; t <= STEPS; t++) {
        inner_step(rank, t);
        int32_t synced = -1;
        if (pb_diloco_step(d, NT, params, &synced) != PB_OK) {
            printf("\n");
            expect("step", PB_ERR_INTERNAL, PB_OK, NULL);
            break;
        }
        if (synced) printf(" %d", t);
    }
    printf("\nweights %s:", name);
    for (int i = 0; i < NT; i++)
        for (int j = 0; j < SIZES[i]; j++) printf(" %.9g", model[i][j]);
    printf("\n");
    int64_t steps = 0, syncs = 0, sent = 0;
    expect("counts", pb_diloco_counts(d, &steps, &syncs, &sent), PB_OK, NULL);
    printf("counts %s: %lld %lld %lld\n", name, (long long)steps, (long long)syncs, (long long)sent);
    expect("close", pb_diloco_close(d), PB_OK, NULL);
}

/* A create that every rank gets wrong alike: refused before any collective, by name. */
static void refused(pb_group *g, const char *what, int32_t n, const pb_tensor *ps, int32_t sync_every,
                    const pb_diloco_options *o, const char *words) {
    pb_diloco *d = NULL;
    expect(what, pb_diloco_create(g, n, ps, sync_every, o, &d), PB_ERR_INVALID_ARGUMENT, words);
    if (d) pb_diloco_close(d);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s RANK PORT WORLD\n", argv[0]); return 2; }
    int rank = atoi(argv[1]), world = atoi(argv[3]);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[2]);
    pb_group *g = NULL;
    expect("init", pb_init(url, "gloo", rank, world, rank, 60, &g), PB_OK, NULL);
    if (!g) return 1;

    /* tests/diloco_parity.py's CONFIGS. */
    pb_diloco_options o;
    pb_diloco_options_init(&o);
    expect("init's size", o.size == sizeof o && o.outer_nesterov == 1 && o.block_size == 128 ? PB_OK : -1,
           PB_OK, NULL);
    run(g, rank, "plain", 4, &o);
    o.fragments = 2, o.delay = 1, o.alpha = 0.5;
    run(g, rank, "streaming", 4, &o);
    pb_diloco_options_init(&o);
    o.quantization = PB_QUANT_INT4, o.block_size = 8, o.error_feedback = 1;
    o.outer_lr = 0.5, o.outer_momentum = 0.8, o.outer_nesterov = 0;
    run(g, rank, "int4", 3, &o);

    /* Bad input, the same on every rank. */
    start();
    pb_diloco_options_init(&o);
    refused(g, "NULL params", NT, NULL, 4, NULL, "pb_diloco_create: params is NULL with n = 4");
    refused(g, "no params", 0, params, 4, NULL, "params is empty");
    int32_t ints[3] = {0};
    pb_tensor it = {ints, 3, PB_INT32, PB_CPU};
    refused(g, "int32 params", 1, &it, 4, NULL, "params[0] is PB_INT32: only floating-point tensors");
    refused(g, "sync_every 0", NT, params, 0, NULL, "sync_every must be a positive integer, got 0");
    o.fragments = 5;
    refused(g, "5 fragments of 4", NT, params, 10, &o, "5 fragments of 4 tensors");
    o.fragments = 3;
    refused(g, "fragments not dividing", NT, params, 4, &o, "sync_every 4 is not a multiple of the 3 fragments");
    o.fragments = 2, o.delay = 2;
    refused(g, "delay too long", NT, params, 4, &o, "delay 2 must be below sync_every / fragments = 2");
    pb_diloco_options_init(&o);
    o.alpha = 1.5;
    refused(g, "alpha 1.5", NT, params, 4, &o, "alpha must be a number in [0, 1], got 1.5");
    o.alpha = NAN;
    refused(g, "alpha NaN", NT, params, 4, &o, "alpha must be a number in [0, 1]");
    pb_diloco_options_init(&o);
    o.outer_lr = 0;
    refused(g, "outer_lr 0", NT, params, 4, &o, "outer_lr must be a positive finite number, got 0");
    o.outer_lr = 0.7, o.outer_momentum = 1;
    refused(g, "outer_momentum 1", NT, params, 4, &o, "outer_momentum must be a number in [0, 1)");
    o.outer_momentum = 0;
    refused(g, "nesterov without momentum", NT, params, 4, &o, "outer_nesterov needs outer_momentum > 0");
    o.outer_momentum = 0.9, o.outer_nesterov = 2;
    refused(g, "outer_nesterov 2", NT, params, 4, &o, "pb_diloco_options.outer_nesterov must be 0 or 1, got 2");
    pb_diloco_options_init(&o);
    o.quantization = 9;
    refused(g, "quantization 9", NT, params, 4, &o,
            "quantization must be PB_QUANT_FP32 (0), PB_QUANT_BF16 (1), PB_QUANT_FP8 (2), PB_QUANT_INT8 (3) or "
            "PB_QUANT_INT4 (4), got 9");
    o.quantization = PB_QUANT_INT8, o.block_size = 0;
    refused(g, "block_size 0", NT, params, 4, &o, "block size must be an integer in [1, 16777216], got 0");
    pb_diloco_options_init(&o);
    o.error_feedback = 1;
    refused(g, "error feedback on fp32", NT, params, 4, &o, "error_feedback needs a lossy quantization");
    o.error_feedback = 0, o.size = 2;
    refused(g, "options size 2", NT, params, 4, &o, "pb_diloco_options.size is 2");
    pb_diloco_options_init(&o);
    expect("NULL out", pb_diloco_create(g, NT, params, 4, &o, NULL), PB_ERR_INVALID_ARGUMENT,
           "out (the pointer to store the handle in) is NULL");
    expect("NULL group", pb_diloco_create(NULL, NT, params, 4, &o, NULL), PB_ERR_INVALID_ARGUMENT, "group is NULL");

    /* Bad input that only the ranks together see: every rank is told what differs. */
    o.alpha = 0.25 * rank;
    refused(g, "alpha differs", NT, params, 4, &o, "DiLoCo settings differ across ranks");
    pb_diloco_options_init(&o);
    model[1][0] += (float)rank;
    refused(g, "weights differ", NT, params, 4, &o, "broadcast them first");

    /* Calls on a DiLoCo. */
    start();
    pb_diloco *d = NULL;
    expect("create", pb_diloco_create(g, NT, params, 4, NULL, &d), PB_OK, NULL);
    expect("step NULL handle", pb_diloco_step(NULL, NT, params, NULL), PB_ERR_INVALID_ARGUMENT,
           "pb_diloco_step: diloco is NULL");
    expect("step 3 tensors", pb_diloco_step(d, 3, params, NULL), PB_ERR_INVALID_ARGUMENT, "params: 3 tensors");
    expect("step NULL params", pb_diloco_step(d, NT, NULL, NULL), PB_ERR_INVALID_ARGUMENT, "params is NULL");
    expect("step", pb_diloco_step(d, NT, params, NULL), PB_OK, NULL);
    int64_t steps = -1;
    expect("counts (steps only)", pb_diloco_counts(d, &steps, NULL, NULL), PB_OK, NULL);
    expect("one step counted", steps == 1 ? PB_OK : -1, PB_OK, NULL);
    expect("close", pb_diloco_close(d), PB_OK, NULL);
    expect("close twice", pb_diloco_close(d), PB_ERR_INVALID_ARGUMENT, "not a live pb_diloco handle");
    expect("step after close", pb_diloco_step(d, NT, params, NULL), PB_ERR_INVALID_ARGUMENT,
           "not a live pb_diloco handle");

    expect("finalize", pb_finalize(g), PB_OK, NULL);
    printf("diloco: %d failed checks\n", failures);
    return failures ? 1 : 0;
}
