/* Hooks and strategies registered by a user's Python module, chosen by name from C, as one
 * rank of two: pb_import_module loads tests/data/plugins/pb_user_registry.py (found through
 * PYBRIDGE_PYTHONPATH), a reducer takes its hook "elementwise_max" by pb_reducer_options.hook_name
 * and a federated server its strategy "signsgd" by pb_fed_options.strategy_name; unknown
 * names are refused naming every choice. Usage: registries RANK PORT. Exits 0 when every
 * check held. */
#include <stdio.h>
#include <stdlib.h>
#include "pybridge.h"
#include "expect.h"

static void want(const char *what, int ok) {
    if (!ok) { printf("FAIL %s\n", what); failures++; } else { printf("ok   %s\n", what); }
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s RANK PORT\n", argv[0]); return 2; }
    int rank = atoi(argv[1]);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", argv[2]);

    expect("import a missing module", pb_import_module("no_such_plugin"), PB_ERR_INVALID_ARGUMENT,
           "no module named 'no_such_plugin'");
    expect("import the user's module", pb_import_module("pb_user_registry"), PB_OK, NULL);
    pb_group *g = NULL;
    expect("init", pb_init(url, "gloo", rank, 2, rank, 60, &g), PB_OK, NULL);

    /* The registered hook by name: each gradient becomes its largest value over the ranks. */
    int64_t counts[] = {3};
    int32_t dtypes[] = {PB_FLOAT32};
    pb_reducer_options o;
    pb_reducer_options_init(&o);
    want("hook_name defaults to NULL", o.hook_name == NULL);
    o.hook_name = "no_such_hook";
    pb_reducer *r = NULL;
    expect("unknown hook name", pb_reducer_create(g, 1, counts, dtypes, &o, &r), PB_ERR_INVALID_ARGUMENT,
           "unknown comm hook 'no_such_hook'; choose one of allreduce, fp16, bf16, powersgd, hierarchical, elementwise_max");
    o.hook_name = "elementwise_max";
    expect("create with hook_name", pb_reducer_create(g, 1, counts, dtypes, &o, &r), PB_OK, NULL);
    for (int step = 0; step < 2; step++) {
        pb_tensor t;
        expect("grad", pb_reducer_grad(r, 0, &t), PB_OK, NULL);
        float *v = t.data;
        v[0] = (float)rank; v[1] = -(float)rank; v[2] = (float)(step * (rank + 1));
        expect("mark", pb_reducer_mark_ready(r, 0), PB_OK, NULL);
        expect("wait", pb_reducer_wait(r, 30), PB_OK, NULL);
        expect("grad after wait", pb_reducer_grad(r, 0, &t), PB_OK, NULL);
        v = t.data;
        want("max over the ranks", v[0] == 1 && v[1] == 0 && v[2] == (float)(2 * step));
    }
    expect("reducer close", pb_reducer_close(r), PB_OK, NULL);

    /* The registered strategy by name: x <- x - lr * sign(pseudo-gradient). */
    float model[3] = {0, 0, 0};
    pb_tensor m = {model, 3, PB_FLOAT32, PB_CPU};
    if (rank == 0) {
        pb_fed_server *s = NULL;
        expect("server", pb_fed_server_new(g, PB_FED_ASYNC, 60, 0, &s), PB_OK, NULL);
        pb_fed_options f;
        pb_fed_options_init(&f);
        want("strategy_name defaults to NULL", f.strategy_name == NULL);
        f.strategy_name = "no_such_strategy";
        expect("unknown strategy name", pb_fed_server_configure(s, &f), PB_ERR_INVALID_ARGUMENT,
               "unknown server strategy 'no_such_strategy'; choose one of fedavg, fedadagrad, fedadam, fedyogi, signsgd");
        f.strategy_name = "signsgd";
        expect("configure with strategy_name", pb_fed_server_configure(s, &f), PB_OK, NULL);
        int64_t clients[] = {0, 1};
        expect("start round", pb_fed_server_start_round(s, clients, 2, &m, PB_FED_TRAIN), PB_OK, NULL);
        pb_fed_result res;
        int32_t has = 1, n = 0;
        while (has)
            expect("next result", pb_fed_server_next_result(s, &res, &has), PB_OK, NULL);
        expect("aggregate", pb_fed_server_aggregate(s, 0.25, &m, &n), PB_OK, NULL);
        want("signSGD's step", n == 2 && model[0] == 0.25f && model[1] == -0.25f && model[2] == 0);
        expect("server close", pb_fed_server_close(s), PB_OK, NULL);
    } else {
        pb_fed_worker *w = NULL;
        expect("worker", pb_fed_worker_new(g, &w), PB_OK, NULL);
        pb_fed_task task;
        int32_t has = 0;
        while (pb_fed_worker_next_task(w, &task, &has) == PB_OK && has) {
            expect("task model", pb_fed_worker_task_model(w, &m), PB_OK, NULL);
            model[0] += (float)(task.client + 1); /* trained weights: model + (c+1) (1, -1, 0) */
            model[1] -= (float)(task.client + 1);
            expect("submit", pb_fed_worker_submit(w, &m, task.client + 1), PB_OK, NULL);
        }
        expect("worker close", pb_fed_worker_close(w), PB_OK, NULL);
    }
    expect("finalize", pb_finalize(g), PB_OK, NULL);
    printf("registries: %d failed checks\n", failures);
    return failures != 0;
}
