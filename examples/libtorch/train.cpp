// train.cpp - a plain C++ libtorch program made data-parallel by pybridge's C ABI.
//
// The model (8 -> 16 -> tanh -> 4, mean squared error) and its SGD loop are ordinary
// libtorch code. pybridge adds three calls: pb_init (from pybridge-launch's environment),
// pb_broadcast_params (rank 0's parameters to every rank, by handle) and pb_reducer_attach
// (the reducer hooks the parameters' autograd: backward itself averages the gradients).
//
//   pybridge-launch --nproc-per-node 2 ./train --steps 20 --mode view --hook allreduce
//
// Each rank trains on its own rows of every global batch. --mode copy (default) keeps each
// .grad the program's own tensor; --mode view makes it the bucket's memory (torch DDP's
// gradient_as_bucket_view), checked after every backward. --hook chooses how buckets
// travel (allreduce, fp16, bf16, powersgd, hierarchical, gossip). Both take lists
// (--mode copy,view --hook allreduce,fp16): the program trains a fresh model for each
// pair in turn. It also trains a copy of the model in-process on the whole global batch,
// and prints how far the data-parallel parameters are from it. --out PREFIX: rank 0
// writes each run's final parameters to PREFIX-MODE-HOOK.txt.
//
// Data and initial parameters come from closed formulas (sin, cos; no random generator),
// so the Python twin under torch DDP (tests/test_handles_cpp.py) builds the same numbers.

#include <ATen/ATen.h>
#include <pybridge.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int64_t kIn = 8, kHidden = 16, kOut = 4, kRows = 6;  // kRows per rank per step
constexpr double kLR = 0.1;

void ok(int rc, const char *what) {
  if (rc != PB_OK) throw std::runtime_error(std::string(what) + ": " + pb_last_error());
}

// A matrix of f(i, j) computed in double and stored as float32.
at::Tensor formula(int64_t rows, int64_t cols, double a, double b, double c, double scale) {
  std::vector<float> v(rows * cols);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) v[i * cols + j] = static_cast<float>(scale * std::sin(a * i + b * j + c));
  return at::from_blob(v.data(), {rows, cols}, at::kFloat).clone();
}

std::vector<at::Tensor> init_params() {
  std::vector<at::Tensor> ps = {formula(kHidden, kIn, 1.3, 0.7, 0.5, 0.3), formula(1, kHidden, 0.9, 0.4, 0.1, 0.1).view({kHidden}),
                                formula(kOut, kHidden, 0.6, 1.1, 0.2, 0.3), formula(1, kOut, 0.3, 0.8, 0.7, 0.1).view({kOut})};
  for (auto &p : ps) p.set_requires_grad(true);
  return ps;
}

// Step s's global batch: world * kRows rows of inputs and targets.
std::pair<at::Tensor, at::Tensor> batch(int64_t step, int64_t world) {
  int64_t rows = world * kRows;
  at::Tensor x = formula(rows, kIn, 0.37, 0.71, 0.13 * step, 1.0);
  at::Tensor y = formula(rows, kOut, 0.23, 1.7, 0.29 * step + 1.0, 0.5);
  return {x, y};
}

// torch::optim::Optimizer::zero_grad, as libtorch (and gotch) do it: detach_() each grad,
// then drop it (set_to_none, the default) or zero it in place.
void zero_grad(std::vector<at::Tensor> &ps, bool set_to_none) {
  for (auto &p : ps) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().detach_();
    if (set_to_none)
      p.mutable_grad().reset();
    else
      p.mutable_grad().zero_();
  }
}

double train_step(std::vector<at::Tensor> &ps, const at::Tensor &x, const at::Tensor &y, int step) {
  zero_grad(ps, step % 2 == 0);  // both of libtorch's ways, in turn
  at::Tensor h = at::tanh(at::linear(x, ps[0], ps[1]));
  at::Tensor loss = at::mse_loss(at::linear(h, ps[2], ps[3]), y);
  loss.backward();  // with an attached reducer: the gradients are averaged when this returns
  torch::autograd::AutoGradMode no_grad(false);
  for (auto &p : ps) p.add_(p.grad(), -kLR);
  return loss.item<double>();
}

int32_t hook_code(const std::string &name, pb_reducer_options &o) {
  if (name == "allreduce") return PB_HOOK_ALLREDUCE;
  if (name == "fp16") return PB_HOOK_FP16;
  if (name == "bf16") return PB_HOOK_BF16;
  if (name == "powersgd") return PB_HOOK_POWERSGD;
  if (name == "hierarchical") return PB_HOOK_HIERARCHICAL;
  if (name == "gossip") {
    o.gossip_topology = PB_GOSSIP_CUBE;
    return PB_HOOK_ALLREDUCE;
  }
  throw std::runtime_error("--hook " + name + ": choose allreduce, fp16, bf16, powersgd, hierarchical or gossip");
}

std::vector<std::string> split(const std::string &list) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t comma; (comma = list.find(',', at)) != std::string::npos; at = comma + 1)
    parts.push_back(list.substr(at, comma - at));
  parts.push_back(list.substr(at));
  return parts;
}

// Trains a fresh model with a reducer of this mode and hook; returns 0 or throws.
void run(pb_group *g, int32_t rank, int32_t world, int steps, const std::string &mode, const std::string &hook,
         const std::string &out) {
  if (mode != "copy" && mode != "view") throw std::runtime_error("--mode " + mode + ": choose copy or view");
  std::vector<at::Tensor> ps = init_params(), reference = init_params();
  std::vector<pb_tensor> handles;
  for (auto &p : ps) handles.push_back(pb_tensor{&p, 0, PB_TORCH_TENSOR, PB_CPU});
  ok(pb_broadcast_params(g, static_cast<int32_t>(handles.size()), handles.data(), 0), "pb_broadcast_params");

  pb_reducer_options o;
  pb_reducer_options_init(&o);
  o.hook = hook_code(hook, o);
  o.flags = mode == "view" ? PB_REDUCER_BUCKET_VIEW : 0;
  pb_reducer *r = nullptr;
  ok(pb_reducer_attach(g, static_cast<int32_t>(handles.size()), handles.data(), &o, &r), "pb_reducer_attach");

  int moved = 0;  // view mode: steps after which a .grad was not its bucket's memory
  double loss = 0;
  for (int s = 0; s < steps; s++) {
    auto [x, y] = batch(s, world);
    loss = train_step(ps, x.narrow(0, rank * kRows, kRows), y.narrow(0, rank * kRows, kRows), s);
    ok(pb_reducer_wait(r, 0), "the reduction");  // PB_OK at once, or how the reduction failed
    train_step(reference, x, y, s);              // one process on the whole global batch
    if (mode == "view") {
      for (size_t i = 0; i < ps.size(); i++) {
        pb_tensor view;
        ok(pb_reducer_grad(r, static_cast<int32_t>(i), &view), "pb_reducer_grad");
        moved += ps[i].grad().data_ptr() != view.data;
      }
    }
  }
  double diff = 0;
  for (size_t i = 0; i < ps.size(); i++) diff = std::max(diff, (ps[i] - reference[i]).abs().max().item<double>());
  std::printf("rank %d: %s/%s: %d steps, loss %.6f, max |parameter - one process| %.3g, grads moved %d\n", rank,
              mode.c_str(), hook.c_str(), steps, loss, diff, moved);
  if (rank == 0 && !out.empty()) {
    std::ofstream f(out + "-" + mode + "-" + hook + ".txt");
    f.precision(9);  // float32 round-trips
    for (auto &p : ps) {
      at::Tensor flat = p.detach().reshape({-1});
      for (int64_t k = 0; k < flat.numel(); k++) f << flat[k].item<float>() << (k + 1 < flat.numel() ? ' ' : '\n');
    }
  }
  ok(pb_reducer_close(r), "pb_reducer_close");  // removes the hooks; each .grad is its own again
}

}  // namespace

int main(int argc, char **argv) {
  int steps = 20;
  std::string modes = "copy", hooks = "allreduce", out;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i], value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--steps") steps = std::atoi(value.c_str());
    else if (flag == "--mode") modes = value;
    else if (flag == "--hook") hooks = value;
    else if (flag == "--out") out = value;
    else {
      std::fprintf(stderr, "train: unknown flag %s (flags: --steps N, --mode copy|view, --hook NAME, --out PREFIX)\n",
                   flag.c_str());
      return 2;
    }
  }
  try {
    pb_group *g = nullptr;
    ok(pb_init(nullptr, "gloo", -1, -1, -1, 60.0, &g), "pb_init");
    int32_t rank = 0, world = 0;
    ok(pb_rank(g, &rank), "pb_rank");
    ok(pb_size(g, &world), "pb_size");
    for (const auto &mode : split(modes))
      for (const auto &hook : split(hooks)) run(g, rank, world, steps, mode, hook, out);
    ok(pb_finalize(g), "pb_finalize");
  } catch (const std::exception &e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
  return 0;
}
