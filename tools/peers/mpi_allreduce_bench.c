/* Open MPI's side of tools/bench_allreduce_vs_mpi.sh: MPI_Allreduce (float32, sum, out of place)
 * timed per message size the way `dtlab bench allreduce` times its algorithms
 * (commands/bench_allreduce.h), in nccl-tests' columns. With the collective argument
 * reduce_scatter or allgather, MPI_Reduce_scatter_block or MPI_Allgather instead (as
 * `dtlab bench allreduce --collective`): S is every rank's whole buffer, N blocks of S/N (S
 * rounded down to N whole floats per block, as nccl-tests and dtlab round it), and
 * busbw = algbw x (N-1)/N:
 *
 *       bytes    time_us  algbw_GBs  busbw_GBs   #wrong
 *
 * Per size S (min_bytes, then x4 up to max_bytes): 3 warm-up calls; m calibrated from one call
 * bracketed by barriers so that a batch of m back-to-back calls takes about 10 ms (1 <= m <= 2000,
 * rank 0's m for every rank); 15 batches, each bracketed by barriers and timed on rank 0 after the
 * closing one; time = the median over batches of batch time / m. algbw = S / time,
 * busbw = algbw x 2(N-1)/N (nccl-tests doc/PERFORMANCE.md).
 * #wrong: every element of the result, after the warm-up (into a buffer of -1s) and after the last
 * batch, compared with the exact sum, and every element of the send buffer with what it held (out of place must leave
 * it alone), summed over the ranks. The inputs are small integers, (rank + 1) x (1 + i mod 16),
 * so every order of additions gives the exact sum.
 *
 * Reduce-scatter: rank r's block of the result is checked; allgather: every block b of the result
 * must be rank b's (element i of the whole buffer = (b + 1) x (1 + i mod 16)).
 *
 * Build: mpicc -O2 -std=c11 tools/peers/mpi_allreduce_bench.c -o mpi_allreduce_bench
 * Run:   mpirun --oversubscribe --bind-to none -np N ./mpi_allreduce_bench [min_bytes max_bytes [collective]]
 *        (defaults 4096 and 67108864; add --allow-run-as-root as root)
 * Exit status: 0, or 1 when an element was wrong, 2 for bad arguments.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kWarmup = 3, kBatches = 15, kMaxCalls = 2000 };
static const double kBatchSeconds = 0.01;

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* The value rank `rank` sends at element i, and the exact sum over `world` ranks. */
static float input(int rank, size_t i) { return (float)((rank + 1) * (int)(1 + i % 16)); }
static float expected(int world, size_t i) { return (float)(world * (world + 1) / 2 * (int)(1 + i % 16)); }

enum Collective { kAllreduce, kReduceScatter, kAllgather };

/* Elements of this rank's buffers that are not what they must be after the collective over
 * `count` floats (the whole buffer; block = count / world). The send buffer must be left alone. */
static long long count_wrong(enum Collective c, const float* send, const float* recv, size_t count, int rank,
                             int world) {
  long long wrong = 0;
  const size_t block = count / (size_t)world;
  if (c == kAllreduce) {
    for (size_t i = 0; i < count; ++i) {
      if (recv[i] != expected(world, i)) ++wrong;
      if (send[i] != input(rank, i)) ++wrong;
    }
  } else if (c == kReduceScatter) {
    for (size_t i = 0; i < block; ++i)
      if (recv[i] != expected(world, (size_t)rank * block + i)) ++wrong;
    for (size_t i = 0; i < count; ++i)
      if (send[i] != input(rank, i)) ++wrong;
  } else {
    for (size_t i = 0; i < count; ++i)
      if (recv[i] != input((int)(i / block), i)) ++wrong;
    for (size_t i = 0; i < block; ++i)
      if (send[i] != input(rank, (size_t)rank * block + i)) ++wrong;
  }
  return wrong;
}

/* One call of the collective on `count` floats (the whole buffer). */
static void call(enum Collective c, const float* send, float* recv, size_t count, int world) {
  const int block = (int)(count / (size_t)world);
  if (c == kAllreduce)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (c == kReduceScatter)
    MPI_Reduce_scatter_block(send, recv, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else
    MPI_Allgather(send, block, MPI_FLOAT, recv, block, MPI_FLOAT, MPI_COMM_WORLD);
}

/* A size argument: a positive multiple of 4 bytes. Prints the error on rank 0. */
static int parse_bytes(const char* text, const char* name, int rank, size_t* out) {
  char* end = NULL;
  const unsigned long long v = strtoull(text, &end, 10);
  if (end == text || *end != '\0' || v == 0 || v % sizeof(float) != 0 ||
      v / sizeof(float) > (unsigned long long)INT_MAX) {
    if (rank == 0)
      fprintf(stderr, "mpi_allreduce_bench: %s '%s' must be a positive multiple of 4 bytes, at most %llu\n", name,
              text, (unsigned long long)INT_MAX * sizeof(float));
    return 0;
  }
  *out = (size_t)v;
  return 1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  size_t min_bytes = 4096, max_bytes = (size_t)64 << 20;
  enum Collective coll = kAllreduce;
  if (argc != 1 && argc != 3 && argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce_bench [min_bytes max_bytes [allreduce|reduce_scatter|allgather]]\n");
    MPI_Finalize();
    return 2;
  }
  if (argc >= 3 && (!parse_bytes(argv[1], "min_bytes", rank, &min_bytes) ||
                    !parse_bytes(argv[2], "max_bytes", rank, &max_bytes))) {
    MPI_Finalize();
    return 2;
  }
  if (argc == 4) {
    if (strcmp(argv[3], "reduce_scatter") == 0) coll = kReduceScatter;
    else if (strcmp(argv[3], "allgather") == 0) coll = kAllgather;
    else if (strcmp(argv[3], "allreduce") != 0) {
      if (rank == 0) fprintf(stderr, "mpi_allreduce_bench: collective '%s' must be allreduce, reduce_scatter or allgather\n", argv[3]);
      MPI_Finalize();
      return 2;
    }
  }
  if (coll != kAllreduce && min_bytes < sizeof(float) * (size_t)world) {
    if (rank == 0) fprintf(stderr, "mpi_allreduce_bench: min_bytes %zu is below one float per rank\n", min_bytes);
    MPI_Finalize();
    return 2;
  }
  if (min_bytes > max_bytes) {
    if (rank == 0) fprintf(stderr, "mpi_allreduce_bench: min_bytes %zu is above max_bytes %zu\n", min_bytes, max_bytes);
    MPI_Finalize();
    return 2;
  }

  const size_t max_count = max_bytes / sizeof(float);
  float* send = malloc(max_count * sizeof(float));
  float* recv = malloc(max_count * sizeof(float));
  if (!send || !recv) {
    fprintf(stderr, "mpi_allreduce_bench: rank %d: cannot allocate 2 x %zu bytes\n", rank, max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  for (size_t i = 0; i < max_count; ++i) send[i] = input(rank, i);
  static const char* const kNames[] = {"MPI_Allreduce float32 sum", "MPI_Reduce_scatter_block float32 sum",
                                       "MPI_Allgather float32"};

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    version[strcspn(version, ",\n")] = '\0';
    printf("# %s, out of place, %d ranks (%s)\n", kNames[coll], world, version);
    printf("# %10s %10s %10s %10s %8s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs", "#wrong");
    fflush(stdout);
  }

  long long wrong_total = 0;
  for (size_t size = min_bytes; size <= max_bytes; size *= 4) {
    /* reduce_scatter and allgather: N whole blocks (nccl-tests' rounding) */
    const size_t unit = coll == kAllreduce ? sizeof(float) : sizeof(float) * (size_t)world;
    const size_t bytes = size / unit * unit;
    const size_t count = bytes / sizeof(float);
    if (coll == kAllgather)  /* this rank's block of the whole buffer's pattern */
      for (size_t i = 0; i < count / (size_t)world; ++i) send[i] = input(rank, (size_t)rank * (count / (size_t)world) + i);
    /* A result buffer that no collective would leave as it is. */
    for (size_t i = 0; i < count; ++i) recv[i] = -1.0f;
    for (int w = 0; w < kWarmup; ++w) call(coll, send, recv, count, world);
    long long wrong = count_wrong(coll, send, recv, count, rank, world);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    call(coll, send, recv, count, world);
    MPI_Barrier(MPI_COMM_WORLD);
    const double one = MPI_Wtime() - t0;
    int calls = (int)(kBatchSeconds / (one > 1e-7 ? one : 1e-7));
    calls = calls < 1 ? 1 : calls > kMaxCalls ? kMaxCalls : calls;
    MPI_Bcast(&calls, 1, MPI_INT, 0, MPI_COMM_WORLD);

    double per_call[kBatches];
    for (int b = 0; b < kBatches; ++b) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int c = 0; c < calls; ++c) call(coll, send, recv, count, world);
      MPI_Barrier(MPI_COMM_WORLD);
      per_call[b] = (MPI_Wtime() - t0) / calls;
    }
    wrong += count_wrong(coll, send, recv, count, rank, world);
    long long wrong_all = 0;
    MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    wrong_total += wrong_all;

    qsort(per_call, kBatches, sizeof per_call[0], compare_doubles);
    const double t = per_call[kBatches / 2];
    if (rank == 0) {
      const double algbw = (double)bytes / t / 1e9;
      const double busbw = algbw * (coll == kAllreduce ? 2.0 : 1.0) * (world - 1) / world;
      printf("%12zu %10.1f %10.3f %10.3f %8lld\n", bytes, t * 1e6, algbw, busbw, wrong_all);
      fflush(stdout);
    }
    if (size > max_bytes / 4) break;  /* the next size would pass max_bytes (or overflow) */
  }

  free(send);
  free(recv);
  MPI_Finalize();
  return wrong_total == 0 ? 0 : 1;
}
