#include "gemm_choice.h"

#include <cstdlib>

#include "errors.h"

namespace lab {

SgemmChoice sgemm_choice_from_env() {
  const char* v = std::getenv("DTLAB_SGEMM");
  const std::string s = v ? v : "";
  if (s.empty()) return SgemmChoice::Build;
  if (s == "reference") return SgemmChoice::Reference;
#ifdef DTLAB_HAVE_OPENBLAS
  if (s == "openblas") return SgemmChoice::Build;
  throw ConfigError("DTLAB_SGEMM=" + s + ": not an sgemm kernel (openblas or reference)",
                    "unset it for OpenBLAS, or DTLAB_SGEMM=reference for the reference kernel");
#else
  if (s == "openblas")
    throw ConfigError("DTLAB_SGEMM=openblas: this build has no OpenBLAS (its sgemm is the reference kernel)",
                      "apt-get install libopenblas-dev and rebuild, or unset DTLAB_SGEMM");
  throw ConfigError("DTLAB_SGEMM=" + s + ": not an sgemm kernel (this build has only the reference)",
                    "unset DTLAB_SGEMM, or DTLAB_SGEMM=reference");
#endif
}

SgemmChoice sgemm_choice() {
  static const SgemmChoice choice = [] {
    try {
      return sgemm_choice_from_env();
    } catch (const ConfigError&) {
      return SgemmChoice::Build;
    }
  }();
  return choice;
}

}  // namespace lab
