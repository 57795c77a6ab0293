/* Generated from capi/pybridge.h by capi/gen_abi.py. Do not edit; change the header and
 * run `make setup` (or python capi/gen_abi.py).
 *
 * pbgo_NAME(arguments of pb_NAME, char **msg) calls pb_NAME and, when it fails, stores a
 * malloc'd copy of pb_last_error() in *msg (may be NULL) in the same cgo call: the message
 * is thread-local and a goroutine may move to another OS thread between two cgo calls.
 * Included by pbgo.h, which defines pbgo_status. */
#ifndef PBGO_GEN_H
#define PBGO_GEN_H

static inline int pbgo_tensor_from_dlpack(const struct DLManagedTensor *src, pb_tensor *out,
                                          char **msg) {
	return pbgo_status(pb_tensor_from_dlpack(src, out), msg);
}

static inline int pbgo_tensor_from_dlpack_versioned(const struct DLManagedTensorVersioned *src,
                                                    pb_tensor *out, char **msg) {
	return pbgo_status(pb_tensor_from_dlpack_versioned(src, out), msg);
}

static inline int pbgo_import_module(const char *name, char **msg) {
	return pbgo_status(pb_import_module(name), msg);
}

static inline int pbgo_init(const char *init_method, const char *backend, int32_t rank,
                            int32_t world_size, int32_t local_rank, double timeout_seconds,
                            pb_group **out, char **msg) {
	return pbgo_status(pb_init(init_method, backend, rank, world_size, local_rank,
	                           timeout_seconds, out), msg);
}

static inline int pbgo_init_v2(const char *init_method, const char *backend, int32_t rank,
                               int32_t world_size, int32_t local_rank, double timeout_seconds,
                               int32_t flags, double watchdog_seconds, pb_group **out, char **msg) {
	return pbgo_status(pb_init_v2(init_method, backend, rank, world_size, local_rank,
	                              timeout_seconds, flags, watchdog_seconds, out), msg);
}

static inline int pbgo_finalize(pb_group *group, char **msg) {
	return pbgo_status(pb_finalize(group), msg);
}

static inline int pbgo_rank(pb_group *group, int32_t *out, char **msg) {
	return pbgo_status(pb_rank(group, out), msg);
}

static inline int pbgo_size(pb_group *group, int32_t *out, char **msg) {
	return pbgo_status(pb_size(group, out), msg);
}

static inline int pbgo_local_rank(pb_group *group, int32_t *out, char **msg) {
	return pbgo_status(pb_local_rank(group, out), msg);
}

static inline int pbgo_job_env(int32_t *rank, int32_t *world_size, int32_t *local_rank,
                               int32_t *local_world_size, char *master_addr,
                               int32_t master_addr_size, int32_t *master_port, char **msg) {
	return pbgo_status(pb_job_env(rank, world_size, local_rank, local_world_size, master_addr,
	                              master_addr_size, master_port), msg);
}

static inline int pbgo_group_abort(pb_group *group, const char *reason, char **msg) {
	return pbgo_status(pb_group_abort(group, reason), msg);
}

static inline int pbgo_init_abort(const char *reason, char **msg) {
	return pbgo_status(pb_init_abort(reason), msg);
}

static inline int pbgo_group_split(pb_group *parent, int32_t color, int32_t key, pb_group **out,
                                   char **msg) {
	return pbgo_status(pb_group_split(parent, color, key, out), msg);
}

static inline int pbgo_group_new(pb_group *parent, const int32_t *ranks, int32_t n, pb_group **out,
                                 char **msg) {
	return pbgo_status(pb_group_new(parent, ranks, n, out), msg);
}

static inline int pbgo_group_split_backend(pb_group *parent, int32_t color, int32_t key,
                                           const char *backend, pb_group **out, char **msg) {
	return pbgo_status(pb_group_split_backend(parent, color, key, backend, out), msg);
}

static inline int pbgo_group_nodes(pb_group *parent, int32_t ranks_per_node, pb_group **intra,
                                   pb_group **cross, char **msg) {
	return pbgo_status(pb_group_nodes(parent, ranks_per_node, intra, cross), msg);
}

static inline int pbgo_group_global_rank(pb_group *group, int32_t group_rank, int32_t *out,
                                         char **msg) {
	return pbgo_status(pb_group_global_rank(group, group_rank, out), msg);
}

static inline int pbgo_group_rank_of(pb_group *group, int32_t global_rank, int32_t *out,
                                     char **msg) {
	return pbgo_status(pb_group_rank_of(group, global_rank, out), msg);
}

static inline int pbgo_group_close(pb_group *group, char **msg) {
	return pbgo_status(pb_group_close(group), msg);
}

static inline int pbgo_group_free(pb_group *group, char **msg) {
	return pbgo_status(pb_group_free(group), msg);
}

static inline int pbgo_group_set_stream(pb_group *group, void *cuda_stream, char **msg) {
	return pbgo_status(pb_group_set_stream(group, cuda_stream), msg);
}

static inline int pbgo_device(pb_group *group, int32_t *out, char **msg) {
	return pbgo_status(pb_device(group, out), msg);
}

static inline int pbgo_barrier(pb_group *group, char **msg) {
	return pbgo_status(pb_barrier(group), msg);
}

static inline int pbgo_broadcast(pb_group *group, const pb_tensor *t, int32_t root, char **msg) {
	return pbgo_status(pb_broadcast(group, t, root), msg);
}

static inline int pbgo_all_reduce(pb_group *group, const pb_tensor *t, int32_t op, char **msg) {
	return pbgo_status(pb_all_reduce(group, t, op), msg);
}

static inline int pbgo_all_gather(pb_group *group, const pb_tensor *input, const pb_tensor *output,
                                  char **msg) {
	return pbgo_status(pb_all_gather(group, input, output), msg);
}

static inline int pbgo_reduce_scatter(pb_group *group, const pb_tensor *input,
                                      const pb_tensor *output, int32_t op, char **msg) {
	return pbgo_status(pb_reduce_scatter(group, input, output, op), msg);
}

static inline int pbgo_send(pb_group *group, const pb_tensor *t, int32_t dst, int32_t tag,
                            char **msg) {
	return pbgo_status(pb_send(group, t, dst, tag), msg);
}

static inline int pbgo_recv(pb_group *group, const pb_tensor *t, int32_t src, int32_t tag,
                            char **msg) {
	return pbgo_status(pb_recv(group, t, src, tag), msg);
}

static inline int pbgo_buffer_new(int32_t dtype, int64_t count, int32_t device, pb_buffer **out,
                                  char **msg) {
	return pbgo_status(pb_buffer_new(dtype, count, device, out), msg);
}

static inline int pbgo_buffer_tensor(pb_buffer *buffer, pb_tensor *out, char **msg) {
	return pbgo_status(pb_buffer_tensor(buffer, out), msg);
}

static inline int pbgo_buffer_close(pb_buffer *buffer, char **msg) {
	return pbgo_status(pb_buffer_close(buffer), msg);
}

static inline int pbgo_buffer_free(pb_buffer *buffer, char **msg) {
	return pbgo_status(pb_buffer_free(buffer), msg);
}

static inline int pbgo_broadcast_async(pb_group *group, pb_buffer *buffer, int32_t root,
                                       pb_work **work, char **msg) {
	return pbgo_status(pb_broadcast_async(group, buffer, root, work), msg);
}

static inline int pbgo_all_reduce_async(pb_group *group, pb_buffer *buffer, int32_t op,
                                        pb_work **work, char **msg) {
	return pbgo_status(pb_all_reduce_async(group, buffer, op, work), msg);
}

static inline int pbgo_all_gather_async(pb_group *group, pb_buffer *input, pb_buffer *output,
                                        pb_work **work, char **msg) {
	return pbgo_status(pb_all_gather_async(group, input, output, work), msg);
}

static inline int pbgo_reduce_scatter_async(pb_group *group, pb_buffer *input, pb_buffer *output,
                                            int32_t op, pb_work **work, char **msg) {
	return pbgo_status(pb_reduce_scatter_async(group, input, output, op, work), msg);
}

static inline int pbgo_isend(pb_group *group, pb_buffer *buffer, int32_t dst, int32_t tag,
                             pb_work **work, char **msg) {
	return pbgo_status(pb_isend(group, buffer, dst, tag, work), msg);
}

static inline int pbgo_irecv(pb_group *group, pb_buffer *buffer, int32_t src, int32_t tag,
                             pb_work **work, char **msg) {
	return pbgo_status(pb_irecv(group, buffer, src, tag, work), msg);
}

static inline int pbgo_all_reduce_tensor_async(pb_group *group, const pb_tensor *t, int32_t op,
                                               pb_work **work, char **msg) {
	return pbgo_status(pb_all_reduce_tensor_async(group, t, op, work), msg);
}

static inline int pbgo_broadcast_tensor_async(pb_group *group, const pb_tensor *t, int32_t root,
                                              pb_work **work, char **msg) {
	return pbgo_status(pb_broadcast_tensor_async(group, t, root, work), msg);
}

static inline int pbgo_all_gather_tensor_async(pb_group *group, const pb_tensor *input,
                                               const pb_tensor *output, pb_work **work,
                                               char **msg) {
	return pbgo_status(pb_all_gather_tensor_async(group, input, output, work), msg);
}

static inline int pbgo_reduce_scatter_tensor_async(pb_group *group, const pb_tensor *input,
                                                   const pb_tensor *output, int32_t op,
                                                   pb_work **work, char **msg) {
	return pbgo_status(pb_reduce_scatter_tensor_async(group, input, output, op, work), msg);
}

static inline int pbgo_isend_tensor(pb_group *group, const pb_tensor *t, int32_t dst, int32_t tag,
                                    pb_work **work, char **msg) {
	return pbgo_status(pb_isend_tensor(group, t, dst, tag, work), msg);
}

static inline int pbgo_irecv_tensor(pb_group *group, const pb_tensor *t, int32_t src, int32_t tag,
                                    pb_work **work, char **msg) {
	return pbgo_status(pb_irecv_tensor(group, t, src, tag, work), msg);
}

static inline int pbgo_work_wait(pb_work *work, double timeout_seconds, char **msg) {
	return pbgo_status(pb_work_wait(work, timeout_seconds), msg);
}

static inline int pbgo_work_test(pb_work *work, int32_t *done, char **msg) {
	return pbgo_status(pb_work_test(work, done), msg);
}

static inline int pbgo_work_close(pb_work *work, char **msg) {
	return pbgo_status(pb_work_close(work), msg);
}

static inline int pbgo_work_free(pb_work *work, char **msg) {
	return pbgo_status(pb_work_free(work), msg);
}

static inline int pbgo_loader_open(pb_group *group, const char *const *files, int32_t nfiles,
                                   int64_t batch_size, int32_t partition, int32_t shuffle,
                                   int64_t seed, int32_t drop_last, int32_t skip_corrupt,
                                   pb_loader **out, char **msg) {
	return pbgo_status(pb_loader_open(group, files, nfiles, batch_size, partition, shuffle,
	                                  seed, drop_last, skip_corrupt, out), msg);
}

static inline int pbgo_loader_next(pb_loader *loader, const uint8_t **data, const int64_t **offsets,
                                   int64_t *count, int32_t *has_batch, char **msg) {
	return pbgo_status(pb_loader_next(loader, data, offsets, count, has_batch), msg);
}

static inline int pbgo_loader_set_epoch(pb_loader *loader, int64_t epoch, char **msg) {
	return pbgo_status(pb_loader_set_epoch(loader, epoch), msg);
}

static inline int pbgo_loader_epoch(pb_loader *loader, int64_t *out, char **msg) {
	return pbgo_status(pb_loader_epoch(loader, out), msg);
}

static inline int pbgo_loader_set_prefetch(pb_loader *loader, int32_t batches, char **msg) {
	return pbgo_status(pb_loader_set_prefetch(loader, batches), msg);
}

static inline int pbgo_loader_num_batches(pb_loader *loader, int64_t *out, char **msg) {
	return pbgo_status(pb_loader_num_batches(loader, out), msg);
}

static inline int pbgo_loader_num_records(pb_loader *loader, int64_t *out, char **msg) {
	return pbgo_status(pb_loader_num_records(loader, out), msg);
}

static inline int pbgo_loader_corrupt_chunks(pb_loader *loader, int64_t *out, char **msg) {
	return pbgo_status(pb_loader_corrupt_chunks(loader, out), msg);
}

static inline int pbgo_loader_close(pb_loader *loader, char **msg) {
	return pbgo_status(pb_loader_close(loader), msg);
}

static inline int pbgo_reducer_create(pb_group *group, int32_t nparams, const int64_t *counts,
                                      const int32_t *dtypes, const pb_reducer_options *options,
                                      pb_reducer **out, char **msg) {
	return pbgo_status(pb_reducer_create(group, nparams, counts, dtypes, options, out), msg);
}

static inline int pbgo_reducer_new(pb_group *group, int32_t nparams, const int64_t *counts,
                                   const int32_t *dtypes, double bucket_cap_mb, int32_t op,
                                   int32_t compression, int32_t flags, pb_reducer **out,
                                   char **msg) {
	return pbgo_status(pb_reducer_new(group, nparams, counts, dtypes, bucket_cap_mb, op,
	                                  compression, flags, out), msg);
}

static inline int pbgo_reducer_grad(pb_reducer *reducer, int32_t index, pb_tensor *out,
                                    char **msg) {
	return pbgo_status(pb_reducer_grad(reducer, index, out), msg);
}

static inline int pbgo_reducer_grads(pb_reducer *reducer, int32_t n, pb_tensor *out, char **msg) {
	return pbgo_status(pb_reducer_grads(reducer, n, out), msg);
}

static inline int pbgo_reducer_generation(pb_reducer *reducer, int64_t *out, char **msg) {
	return pbgo_status(pb_reducer_generation(reducer, out), msg);
}

static inline int pbgo_reducer_mark_ready(pb_reducer *reducer, int32_t index, char **msg) {
	return pbgo_status(pb_reducer_mark_ready(reducer, index), msg);
}

static inline int pbgo_reducer_wait(pb_reducer *reducer, double timeout_seconds, char **msg) {
	return pbgo_status(pb_reducer_wait(reducer, timeout_seconds), msg);
}

static inline int pbgo_reducer_poll(pb_reducer *reducer, double timeout_seconds, int32_t *done,
                                    char **msg) {
	return pbgo_status(pb_reducer_poll(reducer, timeout_seconds, done), msg);
}

static inline int pbgo_reducer_set_hook(pb_reducer *reducer, int32_t hook, int32_t rank,
                                        int32_t flags, char **msg) {
	return pbgo_status(pb_reducer_set_hook(reducer, hook, rank, flags), msg);
}

static inline int pbgo_reducer_set_gossip(pb_reducer *reducer, int32_t topology,
                                          int32_t ranks_per_node, int64_t seed, int32_t sync_every,
                                          char **msg) {
	return pbgo_status(pb_reducer_set_gossip(reducer, topology, ranks_per_node, seed,
	                                         sync_every), msg);
}

static inline int pbgo_reducer_set_shapes(pb_reducer *reducer, int32_t nparams,
                                          const int32_t *ndims, const int64_t *dims, char **msg) {
	return pbgo_status(pb_reducer_set_shapes(reducer, nparams, ndims, dims), msg);
}

static inline int pbgo_reducer_zero(pb_reducer *reducer, char **msg) {
	return pbgo_status(pb_reducer_zero(reducer), msg);
}

static inline int pbgo_reducer_bind_grads(pb_reducer *reducer, int32_t n, const pb_tensor *grads,
                                          char **msg) {
	return pbgo_status(pb_reducer_bind_grads(reducer, n, grads), msg);
}

static inline int pbgo_reducer_join(pb_reducer *reducer, int32_t *root, int64_t *shadowed,
                                    char **msg) {
	return pbgo_status(pb_reducer_join(reducer, root, shadowed), msg);
}

static inline int pbgo_reducer_attach(pb_group *group, int32_t n, const pb_tensor *params,
                                      const pb_reducer_options *options, pb_reducer **out,
                                      char **msg) {
	return pbgo_status(pb_reducer_attach(group, n, params, options, out), msg);
}

static inline int pbgo_reducer_close(pb_reducer *reducer, char **msg) {
	return pbgo_status(pb_reducer_close(reducer), msg);
}

static inline int pbgo_reducer_free(pb_reducer *reducer, char **msg) {
	return pbgo_status(pb_reducer_free(reducer), msg);
}

static inline int pbgo_broadcast_params(pb_group *group, int32_t n, const pb_tensor *tensors,
                                        int32_t root, char **msg) {
	return pbgo_status(pb_broadcast_params(group, n, tensors, root), msg);
}

static inline int pbgo_average_params(pb_group *group, int32_t n, const pb_tensor *tensors,
                                      char **msg) {
	return pbgo_status(pb_average_params(group, n, tensors), msg);
}

static inline int pbgo_averager_create(pb_group *group, int32_t period, int32_t warmup_steps,
                                       pb_averager **out, char **msg) {
	return pbgo_status(pb_averager_create(group, period, warmup_steps, out), msg);
}

static inline int pbgo_averager_create_hierarchical(pb_group *group, int32_t nlevels,
                                                    const int32_t *periods,
                                                    const int32_t *group_sizes,
                                                    int32_t warmup_steps, pb_averager **out,
                                                    char **msg) {
	return pbgo_status(pb_averager_create_hierarchical(group, nlevels, periods, group_sizes,
	                                                   warmup_steps, out), msg);
}

static inline int pbgo_averager_step(pb_averager *averager, int32_t n, const pb_tensor *tensors,
                                     int32_t *averaged, char **msg) {
	return pbgo_status(pb_averager_step(averager, n, tensors, averaged), msg);
}

static inline int pbgo_averager_get_step(pb_averager *averager, int64_t *out, char **msg) {
	return pbgo_status(pb_averager_get_step(averager, out), msg);
}

static inline int pbgo_averager_set_step(pb_averager *averager, int64_t step, char **msg) {
	return pbgo_status(pb_averager_set_step(averager, step), msg);
}

static inline int pbgo_averager_close(pb_averager *averager, char **msg) {
	return pbgo_status(pb_averager_close(averager), msg);
}

static inline int pbgo_diloco_create(pb_group *group, int32_t n, const pb_tensor *params,
                                     int32_t sync_every, const pb_diloco_options *options,
                                     pb_diloco **out, char **msg) {
	return pbgo_status(pb_diloco_create(group, n, params, sync_every, options, out), msg);
}

static inline int pbgo_diloco_step(pb_diloco *diloco, int32_t n, const pb_tensor *params,
                                   int32_t *synced, char **msg) {
	return pbgo_status(pb_diloco_step(diloco, n, params, synced), msg);
}

static inline int pbgo_diloco_counts(pb_diloco *diloco, int64_t *steps, int64_t *syncs,
                                     int64_t *bytes_sent, char **msg) {
	return pbgo_status(pb_diloco_counts(diloco, steps, syncs, bytes_sent), msg);
}

static inline int pbgo_diloco_close(pb_diloco *diloco, char **msg) {
	return pbgo_status(pb_diloco_close(diloco), msg);
}

static inline int pbgo_checkpoint_save(const char *directory, int64_t step, int32_t n,
                                       const char *const *names, const pb_tensor *tensors,
                                       pb_loader *loader, pb_reducer *reducer, int32_t keep,
                                       char **msg) {
	return pbgo_status(pb_checkpoint_save(directory, step, n, names, tensors, loader, reducer,
	                                      keep), msg);
}

static inline int pbgo_checkpoint_restore(pb_group *group, const char *directory, int32_t n,
                                          const char *const *names, const pb_tensor *tensors,
                                          pb_loader *loader, pb_reducer *reducer, int64_t *step,
                                          char **msg) {
	return pbgo_status(pb_checkpoint_restore(group, directory, n, names, tensors, loader,
	                                         reducer, step), msg);
}

static inline int pbgo_any_rank(pb_group *group, int32_t flag, int32_t *any, char **msg) {
	return pbgo_status(pb_any_rank(group, flag, any), msg);
}

static inline int pbgo_state_create(pb_state **out, char **msg) {
	return pbgo_status(pb_state_create(out), msg);
}

static inline int pbgo_state_commit(pb_state *state, int64_t step, int32_t n,
                                    const char *const *names, const pb_tensor *tensors,
                                    pb_loader *loader, pb_reducer *reducer, char **msg) {
	return pbgo_status(pb_state_commit(state, step, n, names, tensors, loader, reducer), msg);
}

static inline int pbgo_state_restore(pb_state *state, int32_t n, const char *const *names,
                                     const pb_tensor *tensors, pb_loader *loader,
                                     pb_reducer *reducer, int64_t *step, char **msg) {
	return pbgo_status(pb_state_restore(state, n, names, tensors, loader, reducer, step), msg);
}

static inline int pbgo_state_sync(pb_state *state, pb_group *group, int32_t root, int32_t n,
                                  const char *const *names, const pb_tensor *tensors,
                                  pb_loader *loader, pb_reducer *reducer, int64_t *step,
                                  char **msg) {
	return pbgo_status(pb_state_sync(state, group, root, n, names, tensors, loader, reducer,
	                                 step), msg);
}

static inline int pbgo_state_close(pb_state *state, char **msg) {
	return pbgo_status(pb_state_close(state), msg);
}

static inline int pbgo_elastic_init(const char *backend, const char *store_addr,
                                    double timeout_seconds, pb_group **out, char **msg) {
	return pbgo_status(pb_elastic_init(backend, store_addr, timeout_seconds, out), msg);
}

static inline int pbgo_state_reset(pb_state *state, int32_t n, const char *const *names,
                                   const pb_tensor *tensors, pb_loader *loader, pb_reducer *reducer,
                                   pb_group **group, int64_t *step, char **msg) {
	return pbgo_status(pb_state_reset(state, n, names, tensors, loader, reducer, group,
	                                  step), msg);
}

static inline int pbgo_elastic_finish(pb_group *group, char **msg) {
	return pbgo_status(pb_elastic_finish(group), msg);
}

static inline int pbgo_elastic_last_change(int32_t *lost, int32_t cap, int32_t *n_lost,
                                           int32_t *joined, int32_t *old_size, int32_t *new_size,
                                           int64_t *generation, char **msg) {
	return pbgo_status(pb_elastic_last_change(lost, cap, n_lost, joined, old_size, new_size,
	                                          generation), msg);
}

static inline int pbgo_fed_server_new(pb_group *group, int32_t mode, double timeout_seconds,
                                      int32_t requeue, pb_fed_server **out, char **msg) {
	return pbgo_status(pb_fed_server_new(group, mode, timeout_seconds, requeue, out), msg);
}

static inline int pbgo_fed_server_set_max_norm(pb_fed_server *server, double max_norm, char **msg) {
	return pbgo_status(pb_fed_server_set_max_norm(server, max_norm), msg);
}

static inline int pbgo_fed_server_set_max_samples(pb_fed_server *server, int64_t max_samples,
                                                  char **msg) {
	return pbgo_status(pb_fed_server_set_max_samples(server, max_samples), msg);
}

static inline int pbgo_fed_server_set_affinity(pb_fed_server *server, int64_t client,
                                               const int32_t *workers, int32_t n, char **msg) {
	return pbgo_status(pb_fed_server_set_affinity(server, client, workers, n), msg);
}

static inline int pbgo_fed_server_start_round(pb_fed_server *server, const int64_t *clients,
                                              int64_t n, const pb_tensor *model, int32_t command,
                                              char **msg) {
	return pbgo_status(pb_fed_server_start_round(server, clients, n, model, command), msg);
}

static inline int pbgo_fed_server_next_result(pb_fed_server *server, pb_fed_result *out,
                                              int32_t *has_result, char **msg) {
	return pbgo_status(pb_fed_server_next_result(server, out, has_result), msg);
}

static inline int pbgo_fed_server_result_payload(pb_fed_server *server, const pb_tensor *out,
                                                 char **msg) {
	return pbgo_status(pb_fed_server_result_payload(server, out), msg);
}

static inline int pbgo_fed_server_aggregate(pb_fed_server *server, double lr,
                                            const pb_tensor *model, int32_t *clients, char **msg) {
	return pbgo_status(pb_fed_server_aggregate(server, lr, model, clients), msg);
}

static inline int pbgo_fed_server_result_metric(pb_fed_server *server, const char *name,
                                                double *value, int32_t *found, char **msg) {
	return pbgo_status(pb_fed_server_result_metric(server, name, value, found), msg);
}

static inline int pbgo_fed_server_round_metric(pb_fed_server *server, const char *name,
                                               double *value, int32_t *found, char **msg) {
	return pbgo_status(pb_fed_server_round_metric(server, name, value, found), msg);
}

static inline int pbgo_fed_server_close(pb_fed_server *server, char **msg) {
	return pbgo_status(pb_fed_server_close(server), msg);
}

static inline int pbgo_fed_worker_new(pb_group *group, pb_fed_worker **out, char **msg) {
	return pbgo_status(pb_fed_worker_new(group, out), msg);
}

static inline int pbgo_fed_worker_next_task(pb_fed_worker *worker, pb_fed_task *task,
                                            int32_t *has_task, char **msg) {
	return pbgo_status(pb_fed_worker_next_task(worker, task, has_task), msg);
}

static inline int pbgo_fed_worker_task_model(pb_fed_worker *worker, const pb_tensor *out,
                                             char **msg) {
	return pbgo_status(pb_fed_worker_task_model(worker, out), msg);
}

static inline int pbgo_fed_worker_submit(pb_fed_worker *worker, const pb_tensor *result,
                                         int64_t samples, char **msg) {
	return pbgo_status(pb_fed_worker_submit(worker, result, samples), msg);
}

static inline int pbgo_fed_worker_submit_metrics(pb_fed_worker *worker, const pb_tensor *result,
                                                 int64_t samples, int32_t n,
                                                 const char *const *names, const double *values,
                                                 char **msg) {
	return pbgo_status(pb_fed_worker_submit_metrics(worker, result, samples, n, names,
	                                                values), msg);
}

static inline int pbgo_fed_worker_fail(pb_fed_worker *worker, const char *message, char **msg) {
	return pbgo_status(pb_fed_worker_fail(worker, message), msg);
}

static inline int pbgo_fed_worker_close(pb_fed_worker *worker, char **msg) {
	return pbgo_status(pb_fed_worker_close(worker), msg);
}

static inline int pbgo_fed_worker_free(pb_fed_worker *worker, char **msg) {
	return pbgo_status(pb_fed_worker_free(worker), msg);
}

static inline int pbgo_fed_sample_clients(int64_t num_clients, int64_t per_round, int64_t seed,
                                          int64_t round, int64_t *out, char **msg) {
	return pbgo_status(pb_fed_sample_clients(num_clients, per_round, seed, round, out), msg);
}

static inline int pbgo_fed_server_configure(pb_fed_server *server, const pb_fed_options *options,
                                            char **msg) {
	return pbgo_status(pb_fed_server_configure(server, options), msg);
}

static inline int pbgo_fed_server_last_step(pb_fed_server *server, pb_fed_step *out,
                                            int32_t *has_step, int64_t *refused, char **msg) {
	return pbgo_status(pb_fed_server_last_step(server, out, has_step, refused), msg);
}

static inline int pbgo_observe_start(const char *trace_dir, int metrics_port, char **msg) {
	return pbgo_status(pb_observe_start(trace_dir, metrics_port), msg);
}

static inline int pbgo_observe_enabled(int *out, char **msg) {
	return pbgo_status(pb_observe_enabled(out), msg);
}

static inline int pbgo_observe_flush(char **msg) {
	return pbgo_status(pb_observe_flush(), msg);
}

static inline int pbgo_span_begin(const char *name, const char *category, int64_t *out_span,
                                  char **msg) {
	return pbgo_status(pb_span_begin(name, category, out_span), msg);
}

static inline int pbgo_span_end(int64_t span, char **msg) {
	return pbgo_status(pb_span_end(span), msg);
}

static inline int pbgo_instant(const char *name, const char *category, char **msg) {
	return pbgo_status(pb_instant(name, category), msg);
}

static inline int pbgo_log_scalar(const char *name, double value, int64_t step, char **msg) {
	return pbgo_status(pb_log_scalar(name, value, step), msg);
}

static inline int pbgo_step_end(int64_t *out_steps, char **msg) {
	return pbgo_status(pb_step_end(out_steps), msg);
}

#endif /* PBGO_GEN_H */
