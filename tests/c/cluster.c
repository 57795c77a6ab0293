/* One rank of the multi-node test from plain C (tests/test_cluster.py): started by
 * pybridge-launch in every node of a simulated cluster, or by a real srun or mpirun
 * (tests/test_slurm.py, tests/test_mpirun.py). Allreduces its rank, finds its node's
 * ranks (pb_group_nodes with the launcher's or the scheduler's ranks per node) and prints
 * "RESULT rank=R sum=S intra_first=F intra_size=N". Exits 0 when every call succeeded. */
#include <stdio.h>
#include "pybridge.h"

static int check(const char *what, int status) {
    if (status != PB_OK) fprintf(stderr, "%s: %s: %s\n", what, pb_status_name(status), pb_last_error());
    return status;
}

int main(void) {
    pb_group *g = NULL, *intra = NULL, *cross = NULL;
    if (check("pb_init", pb_init(NULL, "gloo", -1, -1, -1, 60.0, &g))) return 1;
    int32_t rank = 0, first = 0, size = 0;
    float x[64];
    pb_rank(g, &rank);
    for (int i = 0; i < 64; i++) x[i] = (float)rank;
    pb_tensor t = {x, 64, PB_FLOAT32, PB_CPU};
    if (check("pb_all_reduce", pb_all_reduce(g, &t, PB_SUM))) return 1;
    if (check("pb_group_nodes", pb_group_nodes(g, 0, &intra, &cross))) return 1;
    if (check("pb_group_global_rank", pb_group_global_rank(intra, 0, &first))) return 1;
    pb_size(intra, &size);
    printf("RESULT rank=%d sum=%g intra_first=%d intra_size=%d\n", rank, x[0], first, size);
    fflush(stdout);
    return check("pb_finalize", pb_finalize(g)) ? 1 : 0;
}
