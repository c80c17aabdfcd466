// The shared op-test harness. Each op's test file describes cases; for each case the harness
//   1. builds the node on random inputs (the shape rule runs as the node is added),
//   2. runs every backend's kernel and compares it with the native one,
//   3. checks the gradients from the op's gradient rule against central finite differences
//      of L = sum_i <w_i, y_i> (random w_i), the loss accumulated in double,
//   4. checks that bad inputs are refused with a message naming the node.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::testing {

struct OpCase {
  std::vector<Shape> in_shapes;
  std::vector<DType> in_dtypes;  // default f32 for every input
  ir::Attrs attributes;
  std::int64_t int_high = 10;        // integer inputs are drawn from [0, int_high)
  double kink_margin = 0.0;          // float inputs keep |x| >= margin (ReLU's kink at 0)
  bool distinct = false;             // float inputs are pairwise far apart (max pooling's ties)
  double positive_margin = -1.0;     // >= 0: float inputs are |x| + margin (log, sqrt)
  std::vector<int> outputs_in_loss;  // default: every f32 output
  std::vector<int> constant_inputs;  // float inputs not differentiated
  double rtol = 2e-2;
  std::uint64_t seed = 1;
  /// Rewrites random input i (after it is drawn) into the op's domain: a positive variance,
  /// consistent statistics.
  std::function<void(std::size_t i, Tensor& t)> prepare;

  OpCase& shapes(std::vector<Shape> s) {
    in_shapes = std::move(s);
    return *this;
  }
  OpCase& dtypes(std::vector<DType> d) {
    in_dtypes = std::move(d);
    return *this;
  }
  OpCase& attrs(ir::Attrs a) {
    attributes = std::move(a);
    return *this;
  }
  OpCase& ints_below(std::int64_t high) {
    int_high = high;
    return *this;
  }
  OpCase& avoid_kinks(double margin = 0.05) {
    kink_margin = margin;
    return *this;
  }
  /// Float inputs become a random permutation of n evenly spaced values in (-2, 2): neighbours
  /// differ by 4/n, more than the finite-difference step (at most 2e-3 there) while n < 2000, so
  /// no perturbation changes which element of a window is largest.
  OpCase& avoid_ties() {
    distinct = true;
    return *this;
  }
  /// Float inputs become |x| + margin: positive, away from 0 (log, sqrt, pow, a divisor).
  OpCase& positive(double margin = 0.2) {
    positive_margin = margin;
    return *this;
  }
  OpCase& loss_outputs(std::vector<int> o) {
    outputs_in_loss = std::move(o);
    return *this;
  }
  OpCase& constants(std::vector<int> c) {
    constant_inputs = std::move(c);
    return *this;
  }
  OpCase& prepared(std::function<void(std::size_t, Tensor&)> fn) {
    prepare = std::move(fn);
    return *this;
  }
  OpCase& tolerance(double r) {
    rtol = r;
    return *this;
  }
};

/// Inputs the op must refuse, and a piece of the message it must give.
struct BadCase {
  std::vector<Shape> in_shapes;
  std::vector<DType> in_dtypes;
  ir::Attrs attributes;
  std::string expect;
};

void run_op_cases(const std::string& op, const std::vector<OpCase>& cases,
                  const std::vector<BadCase>& bad);
/// The broadcasting shapes every binary elementwise op is tested on (equal shapes, a bias over
/// the last dimension, both stretched, per channel, a lower rank, a scalar), and the pair of
/// shapes that cannot broadcast.
std::vector<OpCase> broadcast_cases();
std::vector<BadCase> broadcast_bad_cases();

/// Ops that have a MINIDL_OP_TEST, and every op their gradient graphs contain.
std::set<std::string> ops_covered_by_tests();
bool register_op_test(const std::string& op, std::vector<OpCase> cases);

}  // namespace minidl::testing

/// MINIDL_OP_TEST(relu, {OpCase()...}, {BadCase{...}}): one test per op.
#define MINIDL_OP_TEST(op, cases, bad)                 \
  static const bool minidl_op_test_registered_##op =   \
      ::minidl::testing::register_op_test(#op, cases); \
  TEST(Op, op) { ::minidl::testing::run_op_cases(#op, cases, bad); }
