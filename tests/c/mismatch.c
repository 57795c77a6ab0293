/* Cross-rank mismatches from plain C, as one rank of two: in checked mode (PB_INIT_CHECKED)
 * ranks passing different dtypes, ops, counts (all_reduce, all_gather, send/recv) and
 * different broadcast_params tensors all get PB_ERR_INVALID_ARGUMENT naming the rank that
 * differs, and the group stays usable; ranks disagreeing on the world size all fail.
 * Usage: mismatch RANK PORT checked|worldsize. Exits 0 when every check held. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pybridge.h"
#include "expect.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s RANK PORT checked|worldsize\n", argv[0]); return 2; }
    int rank = atoi(argv[1]);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[2]);
    pb_group *g = NULL;
    if (strcmp(argv[3], "worldsize") == 0) {
        expect("init with world size 2 on rank 0 and 3 on rank 1",
               pb_init(url, "gloo", rank, rank == 0 ? 2 : 3, rank, 20, &g), PB_ERR_INVALID_ARGUMENT,
               "ranks disagree on the world size: rank 0 world size 2; rank 1 world size 3");
        printf("mismatch: %d failed checks\n", failures);
        return failures != 0;
    }
    expect("watchdog NaN", pb_init_v2(url, "gloo", rank, 2, rank, 30, 0, NAN, &g),
           PB_ERR_INVALID_ARGUMENT, "watchdog_seconds is NaN");
    expect("watchdog infinite", pb_init_v2(url, "gloo", rank, 2, rank, 30, 0, INFINITY, &g),
           PB_ERR_INVALID_ARGUMENT, "watchdog: expected seconds");
    expect("init checked", pb_init_v2(url, "gloo", rank, 2, rank, 30, PB_INIT_CHECKED, 0, &g), PB_OK, NULL);
    expect("unknown init flag", pb_init_v2(url, "gloo", rank, 2, rank, 30, 64, 0, &g),
           PB_ERR_INVALID_ARGUMENT, "unknown flags");
    float f[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int32_t i32[4] = {1, 1, 1, 1};
    pb_tensor tf = {f, 4, PB_FLOAT32, PB_CPU}, ti = {i32, 4, PB_INT32, PB_CPU};
    expect("all_reduce float32 vs int32", pb_all_reduce(g, rank ? &ti : &tf, PB_SUM),
           PB_ERR_INVALID_ARGUMENT, "rank 1 passed all_reduce #1 (sum) int32 x 4 (dtype differs)");
    expect("all_reduce sum vs max", pb_all_reduce(g, &tf, rank ? PB_MAX : PB_SUM),
           PB_ERR_INVALID_ARGUMENT, "rank 1 passed all_reduce #2 (max) float32 x 4 (op or root differs)");
    pb_tensor t5 = {f, 5, PB_FLOAT32, PB_CPU};
    expect("all_reduce 4 vs 5 elements", pb_all_reduce(g, rank ? &t5 : &tf, PB_SUM),
           PB_ERR_INVALID_ARGUMENT, "float32 x 5 (count differs)");
    pb_tensor in1 = {f, 1, PB_FLOAT32, PB_CPU}, out1 = {f + 4, 2, PB_FLOAT32, PB_CPU};
    pb_tensor in2 = {f, 2, PB_FLOAT32, PB_CPU}, out2 = {f + 4, 4, PB_FLOAT32, PB_CPU};
    expect("all_gather 1 vs 2 elements", pb_all_gather(g, rank ? &in2 : &in1, rank ? &out2 : &out1),
           PB_ERR_INVALID_ARGUMENT, "rank 1 passed all_gather #4 float32 x 2 into 4");
    pb_tensor t3 = {f, 3, PB_FLOAT32, PB_CPU};
    expect("send 4 elements, recv 3", rank ? pb_recv(g, &t3, 0, 7) : pb_send(g, &tf, 1, 7),
           PB_ERR_INVALID_ARGUMENT, "rank 0 sends float32 x 4, rank 1 receives float32 x 3");
    pb_tensor params[2] = {{f, 4, PB_FLOAT32, PB_CPU}, {i32, 4, rank ? PB_INT32 : PB_FLOAT32, PB_CPU}};
    expect("broadcast_params with different dtypes", pb_broadcast_params(g, 2, params, 0),
           PB_ERR_INVALID_ARGUMENT, "ranks pass different tensors");
    float one[1] = {(float)(rank + 1)};
    pb_tensor t1 = {one, 1, PB_FLOAT32, PB_CPU};
    expect("all_reduce after the refusals", pb_all_reduce(g, &t1, PB_SUM), PB_OK, NULL);
    if (one[0] != 3) { printf("FAIL sum after the refusals is %g, want 3\n", one[0]); failures++; }
    expect("finalize", pb_finalize(g), PB_OK, NULL);
    printf("mismatch: %d failed checks\n", failures);
    return failures != 0;
}
