// Debian's OpenBLAS 0.3.21 misdetects recent CPUs as "Prescott" and then runs sgemm about 5x
// slower. It reads OPENBLAS_CORETYPE once, when the library is loaded, before main() runs, so
// the only in-process fix is to set it and re-execute the program. This does that once, choosing
// the kernel from the CPU's features (AVX-512: SkylakeX, AVX2: Haswell), unless the user has set
// OPENBLAS_CORETYPE (respected as is) or DTLAB_NO_REEXEC=1.
#pragma once

namespace lab {

// Returns normally when no re-exec is needed or it failed (then the run is only slower).
void ensure_openblas_coretype(int argc, char** argv);
// The coretype chosen for this CPU ("SkylakeX", "Haswell") or nullptr.
const char* suggested_openblas_coretype();

}  // namespace lab
