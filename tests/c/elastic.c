/* Elastic training from plain C (tests/test_elastic_c.py), run under
 * `pybridge-launch --elastic`: a 4-weight linear model with SGD + momentum, gradients
 * reduced by a pb_reducer, data from a static pb_loader, the state committed every
 * COMMIT_EVERY steps and at each epoch's end. Rank DIE_RANK of the first world SIGKILLs
 * itself before step DIE_AT; the survivors get PB_ERR_MEMBERSHIP, pb_state_reset and go on.
 *
 * usage: elastic DATA EPOCHS COMMIT_EVERY DIE_AT DIE_RANK [STEP_MS]
 * STEP_MS: sleep this long in each step while the world is smaller than the first (a
 * replacement started by `--replace 1` then joins at a commit before the end).
 * prints "MEMBERSHIP rank=R: MESSAGE" when a call returned PB_ERR_MEMBERSHIP, "NORESET rank=R
 * status=S barrier=S" (first world: a reset without a change is refused), "RESET rank=R lost=L,.. joined=J old=O new=N gen=G step=S old_handle=STATUS" per reset and
 * "RESULT rank=R world=W gen=G step=S epoch=E w=.. m=.." (exact hex floats) at the end; and
 * "KILL rank=R t=T" before the SIGKILL, "RESUMED rank=R reset_t=T step_t=T" after the first
 * step on a new world (wall clock, for bench/elastic_cgo.py). */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime, nanosleep */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "pybridge.h"

#define NW 4
#define LR 0.05f
#define MOMENTUM 0.9f

static float w[NW], m[NW];
static int64_t epoch;
static const char *names[] = {"w", "m", "epoch"};
static pb_tensor tensors[] = {{w, NW, PB_FLOAT32, PB_CPU}, {m, NW, PB_FLOAT32, PB_CPU},
                              {&epoch, 1, PB_INT64, PB_CPU}};
static pb_state *state;
static pb_loader *loader;
static pb_reducer *reducer;
static int epochs, commit_every, die_at, die_rank, step_ms, first_size;

static double reset_at;  /* when the last pb_state_reset returned, until the next step */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check(const char *what, int status) {
    if (status != PB_OK && status != PB_ERR_MEMBERSHIP)
        fprintf(stderr, "%s: %s: %s\n", what, pb_status_name(status), pb_last_error());
    return status;
}

/* Appends to line (at bytes used) and prints it in one write: the ranks share the console. */
static void say(char *line, int at, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    at += vsnprintf(line + at, 1023 - at, format, ap);
    va_end(ap);
    if (at > 1022) at = 1022;  /* truncated */
    line[at++] = '\n';
    fwrite(line, 1, at, stdout);
    fflush(stdout);
}

static int64_t generation(void) {
    int64_t gen = 0;
    pb_elastic_last_change(NULL, 0, NULL, NULL, NULL, NULL, &gen);
    return gen;
}

static int commit(int64_t step) {
    return check("pb_state_commit", pb_state_commit(state, step, 3, names, tensors, loader, reducer));
}

/* Trains from (epoch, *step) to the end; returns the first status other than PB_OK. */
static int train(pb_group *g, int64_t *step) {
    int32_t rank = 0, size = 0, rc;
    pb_rank(g, &rank);
    pb_size(g, &size);
    for (; epoch < epochs;) {
        if ((rc = check("pb_loader_set_epoch", pb_loader_set_epoch(loader, epoch)))) return rc;
        for (;;) {
            const uint8_t *data;
            const int64_t *offsets;
            int64_t count;
            int32_t has;
            if ((rc = check("pb_loader_next", pb_loader_next(loader, &data, &offsets, &count, &has)))) return rc;
            if (!has) break;
            if (*step + 1 == die_at && rank == die_rank && generation() == 1) {
                char line[1024];
                say(line, 0, "KILL rank=%d t=%.6f", rank, now());  /* for bench/elastic_cgo.py */
                raise(SIGKILL);
            }
            if (step_ms && size < first_size) {  /* time for a replacement to join */
                struct timespec pause = {step_ms / 1000, (step_ms % 1000) * 1000000L};
                nanosleep(&pause, NULL);
            }
            pb_tensor gd;
            if ((rc = check("pb_reducer_grad", pb_reducer_grad(reducer, 0, &gd)))) return rc;
            float *grad = gd.data;
            for (int j = 0; j < NW; j++) {
                grad[j] = 0;
                for (int64_t i = 0; i < count; i++)  /* d/dw of (w_j - target)^2 / 2 */
                    grad[j] += (w[j] - data[offsets[i]] * (j + 1) / 100.0f) / (float)count;
            }
            if ((rc = check("pb_reducer_mark_ready", pb_reducer_mark_ready(reducer, 0)))) return rc;
            if ((rc = check("pb_reducer_wait", pb_reducer_wait(reducer, 0)))) return rc;
            for (int j = 0; j < NW; j++) {
                m[j] = MOMENTUM * m[j] + grad[j];
                w[j] -= LR * m[j];
            }
            ++*step;
            if (reset_at > 0) {  /* the first step on a new world */
                char line[1024];
                say(line, 0, "RESUMED rank=%d reset_t=%.6f step_t=%.6f", rank, reset_at, now());
                reset_at = 0;
            }
            if (*step % commit_every == 0 && (rc = commit(*step))) return rc;
        }
        epoch++;
        if ((rc = commit(*step))) return rc;
    }
    return PB_OK;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: elastic DATA EPOCHS COMMIT_EVERY DIE_AT DIE_RANK [STEP_MS]\n");
        return 2;
    }
    step_ms = argc == 7 ? atoi(argv[6]) : 0;
    first_size = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 0;
    epochs = atoi(argv[2]), commit_every = atoi(argv[3]), die_at = atoi(argv[4]), die_rank = atoi(argv[5]);
    pb_group *g = NULL;
    if (check("pb_elastic_init", pb_elastic_init("gloo", NULL, 20.0, &g))) return 1;
    const char *files[] = {argv[1]};
    int64_t count = NW;
    int32_t dtype = PB_FLOAT32, rank = 0, size = 0;
    if (check("pb_loader_open", pb_loader_open(g, files, 1, 2, PB_PARTITION_STATIC, 1, 7, 1, 0, &loader)) ||
        check("pb_reducer_create", pb_reducer_create(g, 1, &count, &dtype, NULL, &reducer)) ||
        check("pb_state_create", pb_state_create(&state)))
        return 1;
    for (int j = 0; j < NW; j++) w[j] = 1.0f + j;  /* rank 0's start is everyone's (pb_state_sync) */
    int64_t step = 0;
    if (check("pb_state_sync", pb_state_sync(state, g, 0, 3, names, tensors, loader, reducer, &step))) return 1;
    int rc;
    if (generation() == 1) {  /* a reset without a change is refused, and the world stays live */
        rc = pb_state_reset(state, 3, names, tensors, loader, reducer, &g, &step);
        pb_rank(g, &rank);
        char early[1024];
        say(early, snprintf(early, sizeof early, "NORESET rank=%d status=%s", rank, pb_status_name(rc)),
            " barrier=%s", pb_status_name(pb_barrier(g)));  /* not on a joiner: the others are training */
    }
    while ((rc = train(g, &step)) == PB_ERR_MEMBERSHIP) {
        char why[1024];
        snprintf(why, sizeof why, "MEMBERSHIP rank=%d: ", rank);
        say(why, (int)strlen(why), "%.900s", pb_last_error());  /* read before the next call */
        pb_group *old = g;
        do rc = check("pb_state_reset", pb_state_reset(state, 3, names, tensors, loader, reducer, &g, &step));
        while (rc == PB_ERR_MEMBERSHIP);
        if (rc != PB_OK) return 1;
        reset_at = now();
        int32_t lost[8], n_lost = 0, joined = 0, old_size = 0, new_size = 0;
        int64_t gen = 0;
        if (check("pb_elastic_last_change", pb_elastic_last_change(lost, 8, &n_lost, &joined, &old_size, &new_size, &gen)))
            return 1;
        pb_rank(g, &rank);
        char line[1024];
        int at = snprintf(line, sizeof line, "RESET rank=%d lost=", rank);
        for (int i = 0; i < n_lost && i < 8; i++) at += snprintf(line + at, sizeof line - at, "%s%d", i ? "," : "", lost[i]);
        say(line, at, " joined=%d old=%d new=%d gen=%lld step=%lld old_handle=%s", joined, old_size, new_size,
            (long long)gen, (long long)step, pb_status_name(pb_barrier(old)));
    }
    if (rc != PB_OK || check("pb_elastic_finish", pb_elastic_finish(g))) return 1;
    pb_rank(g, &rank);
    pb_size(g, &size);
    char line[1024];
    int at = snprintf(line, sizeof line, "RESULT rank=%d world=%d gen=%lld step=%lld epoch=%lld w=", rank, size,
                      (long long)generation(), (long long)step, (long long)epoch);
    for (int j = 0; j < NW; j++) at += snprintf(line + at, sizeof line - at, "%a,", w[j]);
    at += snprintf(line + at, sizeof line - at, " m=");
    for (int j = 0; j < NW; j++) at += snprintf(line + at, sizeof line - at, "%a,", m[j]);
    say(line, at, "%s", "");
    pb_state_close(state);
    pb_loader_close(loader);
    pb_reducer_close(reducer);
    return check("pb_finalize", pb_finalize(g)) ? 1 : 0;
}
