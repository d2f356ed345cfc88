// DTLAB_SGEMM: which sgemm kernel a dtlab process uses, read from the environment once.
//   unset, "" or "openblas"  the build's backend: OpenBLAS where the build found it (with the
//                            kernel OPENBLAS_CORETYPE names, openblas_env.h), else the reference
//   "reference"              the reference kernel (sgemm_ref's order of additions, gemm_blocked.h),
//                            also in a build with OpenBLAS: a second kernel path without a second
//                            build (CI runs the lessons on it)
// The choice shows wherever the backend is named: `dtlab version`, the backends line of every
// run's header and config.toml, bench output ("reference (DTLAB_SGEMM=reference)").
#pragma once

#include <string>

namespace lab {

enum class SgemmChoice { Build, Reference };

// The choice DTLAB_SGEMM makes; throws ConfigError (exit 2) for another value, or "openblas" in a
// build without it, naming the variable, the value and what it may be.
SgemmChoice sgemm_choice_from_env();
// The same, decided once per process (an invalid value counts as unset here: dtlab's main() calls
// sgemm_choice_from_env() first to refuse it).
SgemmChoice sgemm_choice();

}  // namespace lab
