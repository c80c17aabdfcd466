#include "minidl/ir/op_def.hpp"

#include <algorithm>

#include "minidl/ir/graph.hpp"

namespace minidl::ir {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::Native:
      return "native";
    case Backend::OneDnn:
      return "onednn";
  }
  return "?";
}

int InferCtx::num_inputs() const { return static_cast<int>(node_.inputs().size()); }
const Shape& InferCtx::input(int i) const { return node_.input(i)->shape(); }
DType InferCtx::dtype(int i) const { return node_.input(i)->dtype(); }

void InferCtx::set_output(int i, Shape shape, DType dtype) {
  MINIDL_ASSERT(i >= 0 && i < static_cast<int>(out_shapes_.size()), "output ", i, " of ",
                node_.op());
  out_shapes_[i] = std::move(shape);
  out_dtypes_[i] = dtype;
}

void InferCtx::fail(const std::string& msg) const {
  std::string text = node_.describe() + ": " + msg;
  const auto& names = node_.def().input_names();
  for (int i = 0; i < num_inputs(); ++i) {
    text += i == 0 ? "; " : " ";
    const Value* v = node_.input(i);
    text += fmt::format("{}={}", i < static_cast<int>(names.size()) ? names[i] : "in", v->shape());
    if (v->dtype() != DType::F32) text += fmt::format(":{}", v->dtype());
  }
  throw Error(text);
}

const Attrs& KernelArgs::attrs() const { return node->attrs(); }

OpDef& OpDef::inputs(std::vector<std::string> names) {
  min_inputs_ = -1;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::string& n = names[i];
    const bool optional = !n.empty() && n.back() == '?';
    if (optional) n.pop_back();
    MINIDL_ASSERT(!(min_inputs_ >= 0 && !optional), "op ", name_, ": required input '", n,
                  "' after an optional one");
    if (optional && min_inputs_ < 0) min_inputs_ = static_cast<int>(i);
  }
  if (min_inputs_ < 0) min_inputs_ = static_cast<int>(names.size());
  inputs_ = std::move(names);
  return *this;
}
OpDef& OpDef::outputs(std::vector<std::string> names) {
  outputs_ = std::move(names);
  return *this;
}
OpDef& OpDef::infer(InferFn fn) {
  infer_ = fn;
  return *this;
}
OpDef& OpDef::kernel(Backend backend, KernelFn fn, SupportsFn supports) {
  kernels_.push_back({backend, std::string(backend_name(backend)), supports,
                      [fn](const Node&) -> Kernel { return fn; }});
  return *this;
}
OpDef& OpDef::kernel_factory(Backend backend, std::string name, KernelFactory make,
                             SupportsFn supports) {
  kernels_.push_back({backend, std::move(name), supports, std::move(make)});
  return *this;
}
OpDef& OpDef::elementwise() {
  elementwise_ = true;
  return *this;
}
OpDef& OpDef::layout_aware() {
  MINIDL_ASSERT(!kernels_.empty(), name_, ": layout_aware() must follow a kernel");
  kernels_.back().layouts = true;
  return *this;
}
OpDef& OpDef::bf16_values() {
  MINIDL_ASSERT(!kernels_.empty(), name_, ": bf16_values() must follow a kernel");
  kernels_.back().bf16_values = true;
  return *this;
}
OpDef& OpDef::preferred() {
  MINIDL_ASSERT(!kernels_.empty(), name_, ": preferred() must follow a kernel");
  kernels_.back().preferred = true;
  return *this;
}
OpDef& OpDef::mixed_precision() {
  MINIDL_ASSERT(!kernels_.empty(), name_, ": mixed_precision() must follow a kernel");
  kernels_.back().bf16 = true;
  return *this;
}
OpDef& OpDef::update(int param, int grad, int grad_scale) {
  MINIDL_ASSERT(param >= 0 && grad >= 0 && param != grad, name_, ": update(", param, ", ", grad,
                ") needs two different inputs");
  MINIDL_ASSERT(grad_scale < 0 || grad_scale + 1 == static_cast<int>(inputs_.size()), name_,
                ": the grad_scale input must be the last (optional) one");
  update_ = UpdateRole{param, grad, grad_scale};
  return *this;
}
OpDef& OpDef::communication(CommRole role) {
  comm_ = role;
  return *this;
}

Backend node_backend(const Node& n, Backend preferred) {
  const AttrValue* a = n.annotations().find("backend");
  if (a == nullptr) return preferred;
  const auto& s = std::get<std::string>(*a);
  if (s == "native") return Backend::Native;
  if (s == "onednn") return Backend::OneDnn;
  MINIDL_FAIL(n.describe(), ": unknown backend '", s, "' (expected native or onednn)");
}

std::string_view precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "f32"; }

Precision node_precision(const Node& n) {
  const AttrValue* a = n.annotations().find("precision");
  if (a == nullptr) return Precision::F32;
  const auto& s = std::get<std::string>(*a);
  if (s == "f32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  MINIDL_FAIL(n.describe(), ": unknown precision '", s, "' (expected f32 or bf16)");
}

namespace {
bool stored_bf16(const Value* v) { return v->stored() == DType::BF16; }
bool any_stored_bf16(const Node& n) {
  return std::any_of(n.inputs().begin(), n.inputs().end(), stored_bf16) ||
         std::any_of(n.outputs().begin(), n.outputs().end(), stored_bf16);
}
}  // namespace

std::string kernel_label(const Node& n, const KernelDef& k) {
  const bool bf16 =
      (k.bf16 && node_precision(n) == Precision::BF16) || (k.bf16_values && any_stored_bf16(n));
  return bf16 ? k.name + " bf16" : k.name;
}

bool has_bf16_kernel(const OpDef& def) {
  return std::any_of(def.kernels().begin(), def.kernels().end(),
                     [](const KernelDef& k) { return k.bf16; });
}

std::vector<const KernelDef*> kernel_order(const Node& n, Backend preferred) {
  const Backend want = node_backend(n, preferred);
  const bool named = n.annotations().find("backend") != nullptr;
  const bool bf16_first = node_precision(n) == Precision::BF16 && !named;
  const auto rank = [&](const KernelDef& k) {
    if (bf16_first && k.bf16) return 0;
    if (!named && k.preferred) return 1;
    return k.backend == want ? 2 : 3;
  };
  std::vector<const KernelDef*> order;
  for (int r = 0; r < 4; ++r)
    for (const auto& k : n.def().kernels())
      if (rank(k) == r) order.push_back(&k);
  return order;
}

std::string layout_refusal(const Node& n, const KernelDef& k) {
  if (!k.bf16_values) {
    for (const Value* v : n.inputs())
      if (stored_bf16(v))
        return fmt::format("{} is stored as bf16; this kernel takes f32", v->ref());
    for (const Value* v : n.outputs())
      if (stored_bf16(v))
        return fmt::format("{} is stored as bf16; this kernel takes f32", v->ref());
  }
  if (k.layouts) return {};
  const Value* first = nullptr;
  auto check = [&](const Value* v) -> std::string {
    if (n.def().is_elementwise()) {
      if (first == nullptr) first = v;
      if (v->stored() != first->stored())
        return fmt::format("{} is stored as {} but {} as {}; an elementwise kernel needs one type",
                           v->ref(), v->stored(), first->ref(), first->stored());
      if (v->layout() == first->layout()) return {};
      return fmt::format("{} is in layout {} but {} in {}; an elementwise kernel needs one layout",
                         v->ref(), v->layout().empty() ? "plain" : v->layout(), first->ref(),
                         first->layout().empty() ? "plain" : first->layout());
    }
    if (v->layout().empty()) return {};
    return fmt::format("{} is in layout {}; this kernel takes plain values only", v->ref(),
                       v->layout());
  };
  for (const Value* v : n.inputs())
    if (std::string why = check(v); !why.empty()) return why;
  for (const Value* v : n.outputs())
    if (std::string why = check(v); !why.empty()) return why;
  return {};
}

KernelChoice choose_kernel(const Node& n, Backend preferred) {
  KernelChoice c;
  c.backend = node_backend(n, preferred);
  for (const KernelDef* k : kernel_order(n, preferred)) {
    std::string why = layout_refusal(n, *k);
    if (why.empty() && (k->supports == nullptr || k->supports(n, &why))) {
      c.kernel = k;
      break;
    }
    c.declined += fmt::format("; {} declined: {}", k->name, why);
  }
  return c;
}

OpDef& OpDef::grad(GradFn fn) {
  grad_ = fn;
  return *this;
}
OpDef& OpDef::no_grad(std::string why) {
  no_grad_ = std::move(why);
  return *this;
}
OpDef& OpDef::inplace(int out, int in) {
  shares_.emplace_back(out, in);
  return *this;
}
OpDef& OpDef::alias(int out, int in) {
  shares_.emplace_back(out, in);
  alias_ = true;
  return *this;
}
OpDef& OpDef::flops(FlopsFn fn) {
  flops_ = fn;
  return *this;
}

OpDef& OpDef::side_effect() {
  side_effect_ = true;
  return *this;
}
OpDef& OpDef::source() {
  source_ = true;
  return *this;
}
int OpDef::shares_input(int out) const {
  for (auto [o, i] : shares_)
    if (o == out) return i;
  return -1;
}

}  // namespace minidl::ir
