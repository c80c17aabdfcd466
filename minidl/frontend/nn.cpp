#include "minidl/frontend/nn.hpp"

#include <cmath>

#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"

namespace minidl::nn {

namespace {
std::uint64_t name_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

void initialize(Tensor& t, Init init, std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed,
                std::string_view name) {
  const CounterRng rng(seed);
  const std::uint64_t stream = name_hash(name);
  switch (init) {
    case Init::He:
      rng.fill_normal(t, stream, 0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
      break;
    case Init::Xavier: {
      const auto a = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
      rng.fill_uniform(t, stream, -a, a);
      break;
    }
    case Init::Zeros:
      std::fill_n(t.data<float>(), t.numel(), 0.0f);
      break;
  }
}

ir::Value* Module::param_value(ir::Graph& g, const std::string& full_name, const Tensor& t) {
  if (ir::Node* n = g.find(full_name); n != nullptr && n->op() == "parameter") {
    MINIDL_CHECK(n->bound().raw() == t.raw(), "two different parameters are named '", full_name,
                 "'");
    return n->output();
  }
  return ops::parameter(g, full_name, t);
}

Linear::Linear(std::int64_t in, std::int64_t out, Init init, bool bias)
    : in_(in), out_(out), init_(init) {
  MINIDL_CHECK(in > 0 && out > 0, "Linear(", in, " -> ", out, "): sizes must be positive");
  weight_ = Tensor::zeros({out, in});
  if (bias) bias_ = Tensor::zeros({out});
}

ir::Value* Linear::forward(ir::Value* x) {
  ir::Graph& g = x->graph();
  MINIDL_CHECK(x->shape().rank() == 2 && x->shape()[1] == in_, describe(), " '", name_,
               "': expected input [N,", in_, "], got ", x->shape());
  ir::NameScope scope(g, name_);
  ir::Value* y = ops::matmul(x, param_value(g, join(name_, "weight"), weight_), false, true);
  if (bias_.raw() != nullptr) y = ops::bias_add(y, param_value(g, join(name_, "bias"), bias_));
  return y;
}

void Linear::collect_parameters(const std::string& prefix, NamedTensors& out) {
  out.emplace_back(prefix + "weight", weight_);
  if (bias_.raw() != nullptr) out.emplace_back(prefix + "bias", bias_);
}

void Linear::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  initialize(weight_, init_, in_, out_, seed, prefix + "weight");
  if (bias_.raw() != nullptr) initialize(bias_, Init::Zeros, in_, out_, seed, prefix + "bias");
}

std::string Linear::describe() const {
  return fmt::format("Linear({} -> {}, {})", in_, out_, init_ == Init::He ? "he" : "xavier");
}

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
               std::int64_t stride, std::int64_t pad, Init init, bool bias)
    : in_(in_channels),
      out_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      init_(init) {
  MINIDL_CHECK(in_ > 0 && out_ > 0 && kernel_ > 0 && stride_ > 0 && pad_ >= 0, "Conv2d(", in_,
               " -> ", out_, ", kernel ", kernel_, ", stride ", stride_, ", pad ", pad_,
               "): sizes, kernel and stride must be positive and pad non-negative");
  weight_ = Tensor::zeros({out_, in_, kernel_, kernel_});
  if (bias) bias_ = Tensor::zeros({out_});
}

ir::Value* Conv2d::forward(ir::Value* x) {
  ir::Graph& g = x->graph();
  MINIDL_CHECK(x->shape().rank() == 4 && x->shape()[1] == in_, describe(), " '", name_,
               "': expected input [N,", in_, ",H,W], got ", x->shape());
  ir::NameScope scope(g, name_);
  ir::Value* y =
      ops::apply("conv2d", {x, param_value(g, join(name_, "weight"), weight_)},
                 {{"stride", ir::Ints{stride_, stride_}}, {"pad", ir::Ints{pad_, pad_}}});
  if (bias_.raw() != nullptr) y = ops::bias_add(y, param_value(g, join(name_, "bias"), bias_));
  return y;
}

void Conv2d::collect_parameters(const std::string& prefix, NamedTensors& out) {
  out.emplace_back(prefix + "weight", weight_);
  if (bias_.raw() != nullptr) out.emplace_back(prefix + "bias", bias_);
}

void Conv2d::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  const std::int64_t taps = kernel_ * kernel_;
  initialize(weight_, init_, in_ * taps, out_ * taps, seed, prefix + "weight");
  if (bias_.raw() != nullptr) initialize(bias_, Init::Zeros, 0, 0, seed, prefix + "bias");
}

std::string Conv2d::describe() const {
  return fmt::format("Conv2d({} -> {}, {}x{}, stride {}, pad {}, {})", in_, out_, kernel_, kernel_,
                     stride_, pad_, init_ == Init::He ? "he" : "xavier");
}

namespace {
/// The attributes of a pooling node with a square window.
ir::Attrs pool_attrs(std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  return {{"kernel", ir::Ints{kernel, kernel}},
          {"stride", ir::Ints{stride, stride}},
          {"pad", ir::Ints{pad, pad}}};
}
}  // namespace

MaxPool2d::MaxPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t pad)
    : kernel_(kernel), stride_(stride == 0 ? kernel : stride), pad_(pad) {
  MINIDL_CHECK(kernel_ > 0 && stride_ > 0 && pad_ >= 0 && 2 * pad_ <= kernel_, "MaxPool2d(", kernel,
               ", stride ", stride, ", pad ", pad,
               "): kernel and stride must be positive, pad in [0, kernel / 2]");
}

ir::Value* MaxPool2d::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  return ops::apply("max_pool2d", {x}, pool_attrs(kernel_, stride_, pad_));
}

std::string MaxPool2d::describe() const {
  return fmt::format("MaxPool2d({}x{}, stride {}, pad {})", kernel_, kernel_, stride_, pad_);
}

AvgPool2d::AvgPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                     bool count_include_pad)
    : kernel_(kernel),
      stride_(stride == 0 ? kernel : stride),
      pad_(pad),
      count_include_pad_(count_include_pad) {
  MINIDL_CHECK(kernel_ > 0 && stride_ > 0 && pad_ >= 0 && 2 * pad_ <= kernel_, "AvgPool2d(", kernel,
               ", stride ", stride, ", pad ", pad,
               "): kernel and stride must be positive, pad in [0, kernel / 2]");
}

ir::Value* AvgPool2d::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  ir::Attrs a = pool_attrs(kernel_, stride_, pad_);
  a.set("count_include_pad", count_include_pad_);
  return ops::apply("avg_pool2d", {x}, a);
}

std::string AvgPool2d::describe() const {
  return fmt::format("AvgPool2d({}x{}, stride {}, pad {}{})", kernel_, kernel_, stride_, pad_,
                     count_include_pad_ ? "" : ", count_include_pad false");
}

ir::Value* ReLU::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  return ops::relu(x);
}
ir::Value* Sigmoid::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  return ops::sigmoid(x);
}
ir::Value* Tanh::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  return ops::tanh(x);
}
ir::Value* Flatten::forward(ir::Value* x) {
  ir::NameScope scope(x->graph(), name_);
  return ops::flatten(x);
}

Sequential& Sequential::add(std::unique_ptr<Module> m, std::string name) {
  if (name.empty()) name = std::to_string(children_.size());
  for (const auto& [n, c] : children_)
    MINIDL_CHECK(n != name, "Sequential: two children are named '", name, "'");
  m->set_name(join(name_, name));
  children_.emplace_back(std::move(name), std::move(m));
  return *this;
}

void Sequential::set_name(std::string name) {
  name_ = std::move(name);
  for (auto& [n, child] : children_) child->set_name(join(name_, n));
}

void Sequential::train(bool on) {
  training_ = on;
  for (auto& [n, child] : children_) child->train(on);
}

ir::Value* Sequential::forward(ir::Value* x) {
  for (auto& [name, child] : children_) x = child->forward(x);
  return x;
}

void Sequential::collect_parameters(const std::string& prefix, NamedTensors& out) {
  for (auto& [name, child] : children_) child->collect_parameters(prefix + name + ".", out);
}

void Sequential::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  for (auto& [name, child] : children_) child->reset_parameters(seed, prefix + name + ".");
}

std::string Sequential::describe() const {
  std::string s;
  for (const auto& [name, child] : children_)
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", name, child->describe());
  return "Sequential(" + s + ")";
}

std::unique_ptr<Module> make_activation(const std::string& name) {
  if (name == "relu") return std::make_unique<ReLU>();
  if (name == "sigmoid") return std::make_unique<Sigmoid>();
  if (name == "tanh") return std::make_unique<Tanh>();
  MINIDL_FAIL("unknown activation '", name, "' (expected relu, sigmoid or tanh)");
}

Dropout::Dropout(double p) : p_(p) {
  MINIDL_CHECK(p >= 0.0 && p < 1.0, "Dropout(", p, "): p must be in [0, 1)");
}

ir::Value* Dropout::forward(ir::Value* x) {
  if (!training_ || p_ == 0.0) return x;
  ir::Graph& g = x->graph();
  ir::Value* key = ops::rng_key(g);
  ir::NameScope scope(g, name_);
  // The same seed and name give the same node seed in every graph built for the model.
  const std::uint64_t seed = mix64(seed_ ^ name_hash(name_));
  return ops::dropout(x, key, p_, static_cast<std::int64_t>(seed)).first;
}

void Dropout::reset_parameters(std::uint64_t seed, const std::string& prefix) { seed_ = seed; }

std::string Dropout::describe() const { return fmt::format("Dropout(p={})", p_); }

void load_parameters(Module& m, const NamedTensors& values, const std::string& source) {
  NamedTensors params = m.parameters();
  std::string problems;
  for (auto& [name, t] : params) {
    auto it =
        std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    if (it == values.end()) {
      problems += fmt::format("; missing '{}' {}", name, t.shape());
    } else if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) {
      problems += fmt::format("; '{}' is {} {} in the file, the model has {} {}", name,
                              it->second.shape(), it->second.dtype(), t.shape(), t.dtype());
    }
  }
  for (const auto& [name, t] : values) {
    auto it =
        std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
    if (it == params.end()) problems += fmt::format("; unexpected '{}' {}", name, t.shape());
  }
  MINIDL_CHECK(problems.empty(), "'", source, "' does not match the model", problems);
  for (auto& [name, t] : params) {
    for (const auto& [vn, v] : values)
      if (vn == name) t.copy_from(v);
  }
}

}  // namespace minidl::nn
