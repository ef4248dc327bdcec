// Our GPT against the PyTorch reference (tests/python/gpt_reference.py, run by
// CTest as a fixture on the checkpoint gpt_torch_export wrote): logits, loss
// and every parameter gradient at step 0, the losses of 10 AdamW steps and every
// parameter after them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"
#include "posembed/model/step.h"
#include "test_util.h"
#include "torch_case.h"

namespace posembed::model {
namespace {

using namespace testing;

const std::filesystem::path kDir = POSEMBED_TORCH_DIR;

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

struct Compared {
  double max_err = 0, max_ref = 0, cosine = 0;
};
Compared compare(std::span<const float> ours, const std::vector<float>& theirs) {
  Compared c;
  double dot = 0, a2 = 0, b2 = 0;
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    c.max_err = std::max(c.max_err, test::abs_error(ours[i], theirs[i]));  // NaN: infinite
    c.max_ref = std::max(c.max_ref, std::abs(double(theirs[i])));
    dot += double(ours[i]) * theirs[i];
    a2 += double(ours[i]) * ours[i];
    b2 += double(theirs[i]) * theirs[i];
  }
  c.cosine = (a2 == 0 && b2 == 0) ? 1.0 : dot / std::sqrt(a2 * b2);
  return c;
}

TEST(TorchComparison, LogitsLossGradientsAndTenAdamWSteps) {
  const io::SafetensorsFile ref = io::SafetensorsFile::open(kDir / "torch_out.safetensors");
  ASSERT_EQ(ref.metadata().at("format"), "posembed-torch-reference");
  ASSERT_EQ(ref.metadata().at("version"), "3");  // 3: lr from PyTorch's own schedulers
  RecordProperty("torch", ref.metadata().at("torch"));
  const TorchCase c = make_torch_case();
  Checkpoint info;
  Gpt model = load_checkpoint(kDir / "torch_init.safetensors", &info, false);
  ASSERT_EQ(info.model, c.model);
  const std::int64_t B = c.batch, T = c.seq_len;
  const auto n = static_cast<std::size_t>(B * T);
  Activations acts = make_activations(c.model, B, T);
  const std::span<const std::int64_t> in0(c.inputs.data(), n), tg0(c.targets.data(), n);

  gpt_zero_grad(model);
  const double loss = gpt_forward(model, acts, in0, tg0, T, true, 0);  // dropout is 0
  gpt_backward(model, acts, in0, tg0);

  // Both sides are fp32 with different summation orders (BLAS blocking, torch's
  // kernels). A logit is a dot product of width 64 after 2 blocks; each op adds
  // a few eps of relative error, so ~1e-6 of the logits' scale is expected; we
  // allow 2e-5 of the largest |logit| (observed here: 3e-7 of 1.03).
  const auto logits = ref.to_f32(*ref.find("logits"));
  const Compared cl = compare(acts.logits.first(n * 256), logits);
  EXPECT_LE(cl.max_err, 2e-5 * cl.max_ref) << "logits";
  const double ref_loss = ref.to_f64(*ref.find("loss"))[0];
  // The mean of 128 fp32 per-token losses of size ~5.5: 1e-6 relative.
  EXPECT_NEAR(loss, ref_loss, 1e-6 * ref_loss);
  RecordProperty("logits_max_abs_error", sci(cl.max_err) + " of max " + sci(cl.max_ref));
  RecordProperty("loss_error", sci(std::abs(loss - ref_loss)));

  // Gradients: every tensor, elementwise within 2e-5 of its largest entry
  // (backward chains ~3x as many fp32 ops as forward, and small entries are
  // differences of larger terms; observed worst 4.4e-7) and cosine > 1 - 1e-6.
  double worst = 0, ref_squares = 0;
  std::string worst_name;
  for (const ParamTensor& t : model.tensors) {
    const io::TensorInfo* g = ref.find("grad." + t.name);
    ASSERT_NE(g, nullptr) << t.name;
    ASSERT_EQ(g->shape, t.shape) << t.name;
    for (const double x : ref.to_f64(*g)) ref_squares += x * x;
    const Compared cg = compare(model.grads.subspan(t.offset, t.numel), ref.to_f32(*g));
    EXPECT_LE(cg.max_err, 2e-5 * cg.max_ref + 1e-9) << t.name;
    EXPECT_GT(cg.cosine, 1 - 1e-6) << t.name;
    if (cg.max_ref > 0 && cg.max_err / cg.max_ref > worst) {
      worst = cg.max_err / cg.max_ref;
      worst_name = t.name;
    }
  }
  RecordProperty("gradient_worst_relative_error", sci(worst) + " (" + worst_name + ")");

  // Ten AdamW steps from the same start, with clipping and the schedule's learning
  // rates, twice: the batch as one micro-batch (train_step), and as 4 micro-batches
  // of one window whose gradients are summed in order (data_parallel_step in a
  // world of one, as posembed train runs). PyTorch computes the batch at once;
  // the fold adds 3 fp32 roundings per gradient element, far below the noise
  // the tolerances below allow for. Adam normalises each update, so fp32 noise in
  // tiny gradients moves weights by up to lr per step; we allow 1e-5 relative on
  // each step's loss (observed 1e-7: the mean over 128 tokens averages the noise out).
  const auto ref_losses = ref.to_f64(*ref.find("losses"));
  ASSERT_EQ(ref_losses.size(), static_cast<std::size_t>(c.train.steps));
  // Our schedule against PyTorch's LinearLR + CosineAnnealingLR, which update the
  // rate by a chain of multiplications: ~1 ulp per step, 4 ulps of lr per step allowed.
  const io::TensorInfo* lr_info = ref.find("lr");
  ASSERT_NE(lr_info, nullptr);
  const auto ref_lrs = ref.to_f64(*lr_info);
  ASSERT_EQ(ref_lrs.size(), static_cast<std::size_t>(c.train.steps));
  for (std::int64_t s = 0; s < c.train.steps; ++s) {
    const double tol = 4.0 * double(s + 1) * std::numeric_limits<double>::epsilon() * c.train.lr;
    EXPECT_NEAR(lr_at(c.train, s), ref_lrs[static_cast<std::size_t>(s)], tol) << "step " << s;
  }
  for (const std::int64_t micro_batch : {B, std::int64_t{1}}) {
    const std::string how = micro_batch == B ? "whole_batch" : "micro_batches";
    SCOPED_TRACE(how);
    model = load_checkpoint(kDir / "torch_init.safetensors", nullptr, false);
    const std::vector<float> start(model.params.begin(), model.params.end());
    TrainConfig tc = c.train;
    tc.batch_size = B;
    tc.micro_batch = micro_batch;
    SingleProcess one;
    StepBuffers buffers = make_step_buffers(model, tc, T, one);
    double worst_step = 0;
    for (std::int64_t s = 0; s < c.train.steps; ++s) {
      const std::span<const std::int64_t> in(c.inputs.data() + s * B * T, n), tg(c.targets.data() + s * B * T, n);
      const auto rows = [&](std::span<std::int64_t> ins, std::span<std::int64_t> tgs, std::int64_t first_row) {
        const auto at = static_cast<std::size_t>(first_row * T);
        std::copy_n(in.begin() + at, ins.size(), ins.begin());
        std::copy_n(tg.begin() + at, tgs.size(), tgs.begin());
      };
      const StepStats st = micro_batch == B ? train_step(model, acts, in, tg, T, s, tc)
                                            : data_parallel_step(model, buffers, one, rows, s, tc);
      const double r = ref_losses[static_cast<std::size_t>(s)];
      EXPECT_NEAR(st.loss, r, 1e-5 * r) << "step " << s;
      // Adam and clipping would hide a wrongly scaled sum of micro-batch
      // gradients; the norm before clipping does not (fp32 noise: ~1e-7).
      if (s == 0) {
        EXPECT_NEAR(st.grad_norm, std::sqrt(ref_squares), 1e-5 * std::sqrt(ref_squares));
      }
      worst_step = std::max(worst_step, std::abs(st.loss - r) / r);
    }
    EXPECT_LT(ref_losses.back(), ref_losses.front() - 0.5) << "the reference did not train";
    RecordProperty(how + "_adamw_losses_worst_relative_error", sci(worst_step));

    // Every parameter after the last step, through its displacement from the
    // start (the start itself is shared, so comparing raw values would mostly
    // compare the init with itself). Adam divides each gradient element by its
    // own RMS, so the gradients' fp32 noise (~4e-7 of a tensor's largest entry,
    // above) becomes ~4e-4 of the step of an element whose gradient is 1000x
    // smaller: we allow 2e-3 of the largest displacement (observed worst 5.8e-4,
    // the key biases, whose gradient is zero in exact arithmetic as softmax
    // ignores a per-query constant), plus 2 ulps of |param| per step for the
    // update's and the decay's rounding; and cosine of the displacements > 1 - 1e-6.
    const double ulps = 2.0 * static_cast<double>(c.train.steps) * std::numeric_limits<float>::epsilon();
    double worst_param = 0;
    std::string worst_param_name;
    for (const ParamTensor& t : model.tensors) {
      const io::TensorInfo* p = ref.find("param." + t.name);
      ASSERT_NE(p, nullptr) << t.name;
      ASSERT_EQ(p->shape, t.shape) << t.name;
      const std::vector<float> theirs = ref.to_f32(*p);
      std::vector<float> ours_moved(t.numel), theirs_moved(t.numel);
      for (std::size_t i = 0; i < t.numel; ++i) {
        ours_moved[i] = model.params[t.offset + i] - start[t.offset + i];
        theirs_moved[i] = theirs[i] - start[t.offset + i];
      }
      const Compared cp = compare(model.params.subspan(t.offset, t.numel), theirs);
      const Compared cd = compare(ours_moved, theirs_moved);
      EXPECT_LE(cp.max_err, 2e-3 * cd.max_ref + ulps * cp.max_ref) << t.name;
      EXPECT_GT(cd.cosine, 1 - 1e-6) << t.name;
      EXPECT_GT(cd.max_ref, 0) << t.name << " did not move";
      if (cp.max_err / cd.max_ref > worst_param) {
        worst_param = cp.max_err / cd.max_ref;
        worst_param_name = t.name;
      }
    }
    RecordProperty(how + "_params_after_adamw_worst_error_of_displacement",
                   sci(worst_param) + " (" + worst_param_name + ")");
  }
}

}  // namespace
}  // namespace posembed::model
