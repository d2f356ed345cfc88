#include "openblas_env.h"

#include <unistd.h>

#include <cstdlib>

namespace lab {

const char* suggested_openblas_coretype() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

void ensure_openblas_coretype(int /*argc*/, char** argv) {
#ifndef DTLAB_HAVE_OPENBLAS
  (void)argv;
  return;
#endif
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("DTLAB_NO_REEXEC")) return;
  const char* core = suggested_openblas_coretype();
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  setenv("DTLAB_NO_REEXEC", "1", 1);  // never loop, even if exec'ing the same binary again
  execv("/proc/self/exe", argv);
  // exec failed (no /proc): carry on with the slower kernel.
}

}  // namespace lab
