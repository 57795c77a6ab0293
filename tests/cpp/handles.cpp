// handles.cpp - the C ABI's libtorch handles (PB_TORCH_TENSOR) from a plain C++ libtorch
// program, on the ranks pybridge-launch starts (tests/test_handles_cpp.py):
//   - every dtype the backend reduces, read from the tensor itself: exact sums;
//   - a float64 broadcast, bit-exact;
//   - refusals by name: a NULL handle, an undefined tensor, a non-contiguous one, a
//     complex one, a parameter that does not require grad;
//   - an asynchronous allreduce keeps its tensor's memory alive after the program deleted
//     its at::Tensor (the library's reference), and lets go of it when the work is closed.
// Prints "ok <what>" per check and "handles: N failed checks" at the end (exit 1 if N > 0).

#include <ATen/ATen.h>
#include <pybridge.h>

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

int main() {
  pb_group *g = nullptr;
  if (pb_init(nullptr, "gloo", -1, -1, -1, 60.0, &g) != PB_OK) {
    std::printf("pb_init: %s\n", pb_last_error());
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

  pb_finalize(g);
  std::printf("handles: %d failed checks\n", failed);
  return failed == 0 ? 0 : 1;
}
