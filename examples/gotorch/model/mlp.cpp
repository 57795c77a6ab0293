// mlp.cpp - the libtorch side of the GoTorch-style trainer (see mlp.h): the model only.
//
// Parameters are leaf tensors that require grad; forward and backward are ATen
// calls. The trainer hands the parameters to pybridge by handle (at::Tensor*), and
// pybridge's reducer puts its own hooks on them: nothing here knows about it.

#include "mlp.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

namespace {

thread_local std::string last_error;

int fail(const std::string &msg) {
  last_error = msg;
  return -1;
}

// Runs f, turning any C++ exception into -1 and a message: nothing escapes into Go.
template <typename F>
int guarded(const char *what, F f) {
  try {
    return f();
  } catch (const std::exception &e) {
    return fail(std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(std::string(what) + ": unknown C++ exception");
  }
}

}  // namespace

struct mlp {
  at::Device device{at::kCPU};
  std::vector<at::Tensor> params;    // w1, b1, w2, b2
  std::vector<at::Tensor> momentum;  // undefined until the first step
};

namespace {

// torch.nn.Linear's initialisation (kaiming_uniform_ with a = sqrt(5), then the
// bias): both uniform in +-1/sqrt(fan_in), drawn weight first, from the default
// CPU generator, so the same seed gives Python's numbers.
void linear(int64_t in, int64_t out, std::vector<at::Tensor> &params) {
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  params.push_back(at::empty({out, in}, at::kFloat).uniform_(-bound, bound));
  params.push_back(at::empty({out}, at::kFloat).uniform_(-bound, bound));
}

at::Tensor inputs_of(const mlp *m, const uint8_t *pixels, int32_t n, int64_t width) {
  at::Tensor raw = at::from_blob(const_cast<uint8_t *>(pixels), {n, width}, at::kByte);
  return raw.to(m->device, at::kFloat).div_(255.0);
}

at::Tensor labels_of(const mlp *m, const uint8_t *labels, int32_t n) {
  at::Tensor raw = at::from_blob(const_cast<uint8_t *>(labels), {n}, at::kByte);
  return raw.to(m->device, at::kLong);
}

at::Tensor logits_of(const mlp *m, const at::Tensor &x) {
  at::Tensor h = at::relu(at::linear(x, m->params[0], m->params[1]));
  return at::linear(h, m->params[2], m->params[3]);
}

int check_index(const mlp *m, int32_t i) {
  if (m == nullptr) return fail("model is NULL");
  if (i < 0 || i >= static_cast<int32_t>(m->params.size()))
    return fail("parameter index " + std::to_string(i) + " is out of range for " +
                std::to_string(m->params.size()) + " parameters");
  return 0;
}

}  // namespace

extern "C" {

const char *mlp_last_error(void) { return last_error.c_str(); }

int mlp_new(int32_t inputs, int32_t hidden, int32_t classes, int64_t seed, int32_t device, mlp **out) {
  return guarded("mlp_new", [&] {
    if (out == nullptr) return fail("mlp_new: out is NULL");
    if (inputs < 1 || hidden < 1 || classes < 1) return fail("mlp_new: layer sizes must be positive");
    auto m = std::make_unique<mlp>();
    if (device >= 0) m->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    at::manual_seed(seed);
    linear(inputs, hidden, m->params);
    linear(hidden, classes, m->params);
    for (auto &p : m->params) {
      p = p.to(m->device);
      p.set_requires_grad(true);
    }
    m->momentum.resize(m->params.size());
    *out = m.release();
    return 0;
  });
}

void mlp_free(mlp *m) { delete m; }

int32_t mlp_nparams(const mlp *m) { return m == nullptr ? 0 : static_cast<int32_t>(m->params.size()); }

int mlp_param(mlp *m, int32_t i, void **data, int64_t *count, int32_t *ndim, int64_t *dims) {
  if (check_index(m, i) != 0) return -1;
  const at::Tensor &p = m->params[i];
  if (data != nullptr) *data = p.data_ptr();
  if (count != nullptr) *count = p.numel();
  if (ndim != nullptr) *ndim = static_cast<int32_t>(p.dim());
  if (dims != nullptr)
    for (int64_t d = 0; d < p.dim(); d++) dims[d] = p.size(d);
  return 0;
}

int mlp_param_handle(mlp *m, int32_t i, void **tensor) {
  if (check_index(m, i) != 0) return -1;
  if (tensor == nullptr) return fail("mlp_param_handle: tensor is NULL");
  *tensor = &m->params[i];
  return 0;
}

int mlp_grad_handle(mlp *m, int32_t i, void **tensor) {
  if (check_index(m, i) != 0) return -1;
  if (tensor == nullptr) return fail("mlp_grad_handle: tensor is NULL");
  *tensor = m->params[i].grad().defined() ? &m->params[i].mutable_grad() : nullptr;
  return 0;
}

int mlp_grad(mlp *m, int32_t i, void **data) {
  if (check_index(m, i) != 0) return -1;
  if (data == nullptr) return fail("mlp_grad: data is NULL");
  const at::Tensor &g = m->params[i].grad();
  *data = g.defined() ? g.data_ptr() : nullptr;
  return 0;
}

int mlp_zero_grad(mlp *m) {
  if (m == nullptr) return fail("model is NULL");
  return guarded("mlp_zero_grad", [&] {
    for (auto &p : m->params) {  // libtorch's Optimizer::zero_grad(set_to_none=true)
      if (!p.grad().defined()) continue;
      p.mutable_grad().detach_();
      p.mutable_grad().reset();
    }
    return 0;
  });
}

int mlp_forward_backward(mlp *m, const uint8_t *pixels, const uint8_t *labels, int32_t n, float *loss,
                         int32_t *correct) {
  if (m == nullptr) return fail("model is NULL");
  if (n < 1 || pixels == nullptr || labels == nullptr) return fail("mlp_forward_backward: empty batch");
  return guarded("mlp_forward_backward", [&] {
    int64_t width = m->params[0].size(1);
    at::Tensor x = inputs_of(m, pixels, n, width);
    at::Tensor y = labels_of(m, labels, n);
    at::Tensor logits = logits_of(m, x);
    at::Tensor l = at::cross_entropy_loss(logits, y);
    l.backward();  // a failed reduction in pybridge's hooks throws here, with its message
    if (loss != nullptr) *loss = l.item<float>();
    if (correct != nullptr) *correct = static_cast<int32_t>(logits.argmax(1).eq(y).sum().item<int64_t>());
    return 0;
  });
}

int mlp_evaluate(mlp *m, const uint8_t *pixels, const uint8_t *labels, int32_t n, int32_t *correct) {
  if (m == nullptr) return fail("model is NULL");
  if (n < 1 || pixels == nullptr || labels == nullptr || correct == nullptr)
    return fail("mlp_evaluate: empty batch or NULL output");
  return guarded("mlp_evaluate", [&] {
    torch::autograd::AutoGradMode no_grad(false);
    at::Tensor x = inputs_of(m, pixels, n, m->params[0].size(1));
    at::Tensor y = labels_of(m, labels, n);
    *correct = static_cast<int32_t>(logits_of(m, x).argmax(1).eq(y).sum().item<int64_t>());
    return 0;
  });
}

int mlp_sgd_step(mlp *m, float lr, float momentum) {
  if (m == nullptr) return fail("model is NULL");
  return guarded("mlp_sgd_step", [&] {
    torch::autograd::AutoGradMode no_grad(false);
    for (size_t i = 0; i < m->params.size(); i++) {
      at::Tensor &p = m->params[i];
      const at::Tensor &g = p.grad();
      if (!g.defined()) continue;
      at::Tensor &buf = m->momentum[i];
      if (momentum != 0) {
        // torch.optim.SGD: the first buffer is the gradient itself, then buf = m * buf + g.
        if (!buf.defined())
          buf = g.detach().clone();
        else
          buf.mul_(momentum).add_(g);
        p.add_(buf, -lr);
      } else {
        p.add_(g, -lr);
      }
    }
    return 0;
  });
}

int mlp_copy_to_host(mlp *m, int32_t i, int32_t momentum, float *out, int32_t *defined) {
  if (check_index(m, i) != 0) return -1;
  if (out == nullptr || defined == nullptr) return fail("mlp_copy_to_host: out or defined is NULL");
  return guarded("mlp_copy_to_host", [&] {
    const at::Tensor &src = momentum ? m->momentum[i] : m->params[i];
    *defined = src.defined() ? 1 : 0;
    if (src.defined())  // from the GPU this waits for the queued work that writes src
      at::from_blob(out, src.sizes(), at::TensorOptions().dtype(at::kFloat)).copy_(src.detach());
    return 0;
  });
}

int mlp_synchronize(mlp *m) {
  if (m == nullptr) return fail("model is NULL");
  return guarded("mlp_synchronize", [&] {
    if (m->device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(m->device.index());
    return 0;
  });
}

}  // extern "C"
