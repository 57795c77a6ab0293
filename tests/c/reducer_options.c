/* pb_reducer_options from C (and C++): pb_reducer_options_init, then pb_reducer_create on a
 * world of one; an older caller's smaller struct still works. Usage: reducer_options <port>.
 * Exits 1 on the first failure. */
#include <stddef.h>
#include <stdio.h>
#include "pybridge.h"

#define CHECK(what, cond) do { if (!(cond)) { \
    printf("FAIL %s: %s\n", what, pb_last_error()); return 1; } } while (0)

static int step(pb_reducer *r, float value, float *got) {
    pb_tensor t;
    if (pb_reducer_grad(r, 0, &t) != PB_OK) return 0;
    for (int64_t i = 0; i < t.count; i++) ((float *)t.data)[i] = value;
    if (pb_reducer_mark_ready(r, 0) != PB_OK || pb_reducer_wait(r, 10.0) != PB_OK) return 0;
    if (pb_reducer_grad(r, 0, &t) != PB_OK) return 0;
    *got = ((float *)t.data)[0];
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s PORT\n", argv[0]); return 2; }
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[1]);
    pb_group *g = NULL;
    CHECK("init", pb_init(url, "gloo", 0, 1, 0, 30.0, &g) == PB_OK);
    int64_t counts[] = {6};
    int32_t dtypes[] = {PB_FLOAT32};
    int32_t ndims[] = {2};
    int64_t dims[] = {2, 3};
    float got = 0;

    pb_reducer_options o;
    pb_reducer_options_init(&o);
    CHECK("init's size", o.size == sizeof(pb_reducer_options) && o.op == PB_AVG &&
          o.gossip_topology == PB_GOSSIP_NONE);
    o.hook = PB_HOOK_FP16;
    o.ndims = ndims;
    o.dims = dims;
    pb_reducer *r = NULL;
    CHECK("create", pb_reducer_create(g, 1, counts, dtypes, &o, &r) == PB_OK);
    /* One rank: built-in hooks have nothing to exchange, the average is the value itself. */
    CHECK("fp16 step", step(r, 1.0f / 3, &got) && got == 1.0f / 3);
    CHECK("close", pb_reducer_close(r) == PB_OK);

    /* A caller compiled when the struct ended before `hook`: the rest takes defaults. */
    pb_reducer_options old;
    pb_reducer_options_init(&old);
    old.op = PB_SUM;
    old.hook = 12345; /* beyond the old size: never read */
    old.size = (uint32_t)offsetof(pb_reducer_options, hook);
    CHECK("create (old size)", pb_reducer_create(g, 1, counts, dtypes, &old, &r) == PB_OK);
    CHECK("sum step", step(r, 0.25f, &got) && got == 0.25f);
    CHECK("free (deprecated name)", pb_reducer_free(r) == PB_OK);

    o.bucket_cap_mb = -1;
    CHECK("negative cap refused", pb_reducer_create(g, 1, counts, dtypes, &o, &r) == PB_ERR_INVALID_ARGUMENT);
    CHECK("finalize", pb_finalize(g) == PB_OK);
    printf("reducer_options: ok\n");
    return 0;
}
