#include "minidl/core/threading.hpp"

#include "minidl/core/denormals.hpp"
#include "minidl/core/error.hpp"

namespace minidl {

void set_num_threads(int n) {
  MINIDL_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
  apply_denormals_to_threads();  // threads the larger pool adds get the same MXCSR
}

}  // namespace minidl
