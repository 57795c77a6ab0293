// handles.cpp - the C ABI's libtorch handles (PB_TORCH_TENSOR) from a plain C++ libtorch
// program, on the ranks pybridge-launch starts (tests/test_handles_cpp.py):
//   - every dtype the backend reduces, read from the tensor itself: exact sums;
//   - a float64 broadcast, bit-exact;
//   - refusals by name: a NULL handle, an undefined tensor, a non-contiguous one, a
//     complex one, a parameter that does not require grad;
//   - an asynchronous allreduce keeps its tensor's memory alive after the program deleted
//     its at::Tensor (the library's reference), and lets go of it when the work is closed.
//   - with --elastic (under pybridge-launch --elastic, 3 ranks): a reducer attached to a
//     parameter by handle, its state committed every step; the last rank SIGKILLs itself,
//     and on the survivors pb_reducer_wait after backward says PB_ERR_MEMBERSHIP, naming the
//     lost rank; pb_state_reset puts the same attached reducer on the new world and backward
//     averages over it from then on.
// Prints "ok <what>" per check and "handles: N failed checks" at the end (exit 1 if N > 0).

#include <ATen/ATen.h>
#include <pybridge.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

static int failed = 0;

static void check(bool ok, const std::string &what, const std::string &detail = "") {
  if (ok) {
    std::printf("ok %s\n", what.c_str());
  } else {
    std::printf("FAILED %s %s\n", what.c_str(), detail.c_str());
    failed++;
  }
}

static pb_tensor handle(at::Tensor *t) { return pb_tensor{t, 0, PB_TORCH_TENSOR, PB_CPU}; }

static void refused(pb_group *g, at::Tensor *t, const std::string &what, const std::string &words) {
  pb_tensor d = handle(t);
  int rc = pb_all_reduce(g, &d, PB_SUM);
  std::string msg = pb_last_error();
  check(rc == PB_ERR_INVALID_ARGUMENT && msg.find(words) != std::string::npos, "refused " + what, msg);
}

// The elastic phase: returns after the survivors trained on the smaller world (the rank that
// dies never returns).
static void elastic(pb_group *&g, int32_t rank, int32_t world) {
  at::Tensor w = at::ones({4}).set_requires_grad(true);
  pb_tensor dw = handle(&w);
  const char *names[] = {"w"};
  pb_state *state = nullptr;
  pb_reducer *r = nullptr;
  int64_t step = 0;
  check(pb_state_create(&state) == PB_OK && pb_reducer_attach(g, 1, &dw, nullptr, &r) == PB_OK &&
            pb_state_sync(state, g, 0, 1, names, &dw, nullptr, r, &step) == PB_OK,
        "elastic: attached and synced", pb_last_error());
  int resets = 0, lost = 0, wrong = 0;
  for (int attempts = 0; step < 6 && attempts < 20; attempts++) {
    if (rank == world - 1 && step == 3) raise(SIGKILL);  // lost mid-training
    int32_t me = 0, size = 0;
    pb_rank(g, &me);
    pb_size(g, &size);
    w.mutable_grad().reset();
    bool threw = false;
    try {
      (w * static_cast<double>(me + 1)).sum().backward();  // gradient me + 1: the average is (size + 1) / 2
    } catch (const std::exception &e) {  // a bucket that could not start fails backward itself
      threw = true;
    }
    int status = pb_reducer_wait(r, 0);  // how the reduction went: PB_OK, or the peer that was lost
    if (threw && status == PB_OK) status = PB_ERR_INTERNAL;  // backward failed, and no status says why
    if (status == PB_ERR_MEMBERSHIP) {
      lost += std::string(pb_last_error()).find("lost") != std::string::npos;
      while ((status = pb_state_reset(state, 1, names, &dw, nullptr, r, &g, &step)) == PB_ERR_MEMBERSHIP) {
      }
      check(status == PB_OK, "elastic: pb_state_reset with the attached reducer", pb_last_error());
      resets++;
      continue;
    }
    if (status != PB_OK) {
      check(false, "elastic: a step", pb_last_error());
      return;
    }
    wrong += !at::allclose(w.grad(), at::full({4}, (size + 1) / 2.0));
    {
      torch::autograd::AutoGradMode no_grad(false);
      w.add_(w.grad(), -0.1);
    }
    step++;
    pb_state_commit(state, step, 1, names, &dw, nullptr, r);
  }
  int32_t size = 0;
  pb_size(g, &size);
  check(resets == 1 && size == world - 1, "elastic: one reset onto the smaller world");
  check(lost == 1, "elastic: pb_reducer_wait said PB_ERR_MEMBERSHIP, naming the lost rank");
  check(wrong == 0 && step == 6, "elastic: every gradient the average over the world of its step");
  pb_reducer_close(r);
  pb_state_close(state);
  pb_elastic_finish(g);
}

int main(int argc, char **argv) {
  bool elastic_phase = argc > 1 && std::string(argv[1]) == "--elastic";
  pb_group *g = nullptr;
  int rc0 = elastic_phase ? pb_elastic_init("gloo", nullptr, 20.0, &g) : pb_init(nullptr, "gloo", -1, -1, -1, 60.0, &g);
  if (rc0 != PB_OK) {
    std::printf("init: %s\n", pb_last_error());
    return 1;
  }
  int32_t rank = 0, world = 0;
  pb_rank(g, &rank);
  pb_size(g, &world);

  const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                  at::kChar, at::kByte, at::kInt, at::kLong};
  for (at::ScalarType type : types) {
    at::Tensor x = (at::arange(7) % 3 + rank).to(type);
    pb_tensor d = handle(&x);
    int rc = pb_all_reduce(g, &d, PB_SUM);
    at::Tensor want = at::zeros({7}, at::kLong);
    for (int r = 0; r < world; r++) want += at::arange(7) % 3 + r;
    check(rc == PB_OK && x.scalar_type() == type && at::equal(x, want.to(type)),
          std::string("allreduce ") + c10::toString(type), pb_last_error());
  }

  at::Tensor y = at::rand({1000}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor sent = y.clone();
  pb_tensor dy = handle(&y);
  pb_broadcast(g, &dy, 0);
  pb_tensor ds = handle(&sent);
  pb_broadcast(g, &ds, 0);  // rank 0's values on every rank, to compare with
  check(at::equal(y, sent), "broadcast float64 bit-exact");

  at::Tensor *nothing = nullptr;
  refused(g, nothing, "NULL handle", "the at::Tensor* handle is NULL");
  at::Tensor undefined;
  refused(g, &undefined, "undefined tensor", "tensor is an undefined at::Tensor");
  at::Tensor strided = at::zeros({4, 6}).slice(1, 0, 6, 2);
  refused(g, &strided, "non-contiguous tensor", "tensor is not contiguous (sizes (4, 3), strides (6, 2))");
  at::Tensor complex = at::zeros({3}, at::kComplexFloat);
  refused(g, &complex, "complex tensor", "tensor has dtype torch.complex64");
  at::Tensor plain = at::zeros({3});
  pb_tensor dp = handle(&plain);
  pb_reducer *r = nullptr;
  int rc = pb_reducer_attach(g, 1, &dp, nullptr, &r);
  check(rc == PB_ERR_INVALID_ARGUMENT && std::string(pb_last_error()).find("does not require grad") != std::string::npos,
        "refused attaching a tensor that does not require grad", pb_last_error());

  // The program frees its tensor while the allreduce runs: the library's reference keeps its
  // memory (the storage) alive, and lets go of it when the work is closed.
  const int64_t n = 1 << 16;
  auto *z = new at::Tensor(at::full({n}, rank + 1.0));
  c10::weak_intrusive_ptr<c10::StorageImpl> watch = z->storage().getWeakStorageImpl();
  pb_tensor dz = handle(z);
  pb_work *w = nullptr;
  rc = pb_all_reduce_tensor_async(g, &dz, PB_SUM, &w);
  delete z;
  check(rc == PB_OK && !watch.expired(), "async: the memory outlives the program's tensor", pb_last_error());
  check(pb_work_wait(w, 60.0) == PB_OK, "async: work completes", pb_last_error());
  bool right = false;
  if (auto storage = watch.lock()) {
    at::Tensor kept = at::from_blob(storage->mutable_data(), {n}, at::kFloat);
    right = at::equal(kept, at::full({n}, world * (world + 1) / 2.0));
  }
  check(right, "async: the result is in it");
  pb_work_close(w);
  bool released = false;
  for (int i = 0; i < 500 && !released; i++) {  // gloo's thread lets go just after the work
    released = watch.expired();
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  check(released, "async: released once the work is closed");

  if (elastic_phase) elastic(g, rank, world);
  pb_finalize(g);
  std::printf("handles: %d failed checks\n", failed);
  return failed == 0 ? 0 : 1;
}
