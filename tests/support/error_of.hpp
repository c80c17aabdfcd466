// The message of the minidl::Error that fn throws; a test failure (and "") when it throws none.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "minidl/core/error.hpp"

namespace minidl::testing {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected minidl::Error";
  return {};
}

}  // namespace minidl::testing
