#!/usr/bin/env python3
"""Tests of tools/gpu/report.py: the verdicts it reaches on what a GPU machine's commands leave
behind (which no machine here produces), and on the rehearsal's no-GPU answers. Each case writes
the files the stage's commands would write, runs `report.py stage`, and checks the status, the
note and the figures; the last cases check the verdict's exit code. Run by ctest (gpu.Report).

    test_report.py            exit 0 when every case passes, 1 naming the failed ones
"""
import json
import os
import subprocess
import sys
import tempfile

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.py")
FAILED = []


def write(work, name, text):
    path = os.path.join(work, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text if isinstance(text, str) else json.dumps(text))


def report(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)


def init(tmp, expect_no_gpu=False, pack=None):
    work = tempfile.mkdtemp(dir=tmp)
    data = os.path.join(work, "data")
    for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
              "t10k-labels-idx1-ubyte.gz"):
        write(data, f, "")
    args = ["init", work, "--out", os.path.join(work, "gpu_check.json"), "--mode", "prebuilt" if pack else "built here",
            "--data", data, "--budget", "450"]
    if pack:
        args += ["--pack", pack]
    if expect_no_gpu:
        args.append("--expect-no-gpu")
    r = report(*args)
    assert r.returncode == 0, r.stderr
    return work


def stage(work, name, **rc):
    r = report("stage", work, name, "--seconds", "1", "--budget", "10", *[f"--rc={k}={v}" for k, v in rc.items()])
    assert r.returncode == 0, r.stderr
    with open(os.path.join(work, "stages.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()][-1]


def check(case, rec, status, note=None, **figures):
    problems = []
    if rec["status"] != status:
        problems.append(f"status {rec['status']}, expected {status}")
    if note and not any(note in n for n in rec["notes"]):
        problems.append(f"no note containing '{note}' in {rec['notes']}")
    for k, v in figures.items():
        if rec["figures"].get(k) != v:
            problems.append(f"figures[{k}] = {rec['figures'].get(k)!r}, expected {v!r}")
    if problems:
        FAILED.append(f"{case}: " + "; ".join(problems))
    print(f"{'ok' if not problems else 'FAILED'}: {case}" + (f": {'; '.join(problems)}" if problems else ""))


def gpu_machine(tmp):
    """A work folder whose gpu stage saw one H100."""
    work = init(tmp)
    write(work, "nvidia-smi.txt", "NVIDIA H100 80GB HBM3, 580.159.04, 9.0, 81559 MiB\n")
    write(work, "nvidia-smi-L.txt", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n")
    write(work, "version.txt", "dtlab 0.1.0 (sgemm: reference; transports: threads, nccl)\n"
          "GPU backend: CUDA 13.0 (sm_80, sm_90), cuBLAS 13.1.0, cuDNN 9.19.0 (loaded 9.15.1), NCCL 2.28.9\n"
          "GPU devices: cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB, 132 SMs)\n")
    write(work, "sanitizer-path.txt", "/usr/local/cuda/bin/compute-sanitizer\n")
    meta = json.load(open(os.path.join(work, "meta.json")))
    meta["cuda_arch"] = "sm_80, sm_90"
    write(work, "meta.json", meta)
    check("gpu: an H100", stage(work, "gpu", smi=0, version=0), "passed", devices=1, compute_capability="9.0")
    return work


def gtest_report(tests):
    """gtest's JSON: tests = [(suite.name, result)], result passed, failed or skipped."""
    suites = {}
    for full, result in tests:
        suite, name = full.split(".")
        t = {"name": name, "status": "RUN", "result": "SKIPPED" if result == "skipped" else "COMPLETED", "time": "0.1s"}
        if result == "failed":
            t["failures"] = [{"failure": "test_cuda_ops.cpp:10\nrelative error 3e-5 > 1e-6"}]
        suites.setdefault(suite, []).append(t)
    return {"testsuites": [{"name": s, "testsuite": ts} for s, ts in suites.items()]}


def gtest_log(tests, reason):
    lines = ["# GPU backend: CUDA 13.0"]
    for full, result in tests:
        lines.append(f"[ RUN      ] {full}")
        if result == "skipped":
            lines += ["tests/gpu/x.cpp:50: Skipped", reason(full), f"[  SKIPPED ] {full} (0 ms)"]
        else:
            lines.append(f"[       {'OK' if result == 'passed' else 'FAILED'} ] {full} (1 ms)")
    return "\n".join(lines) + "\n"


def run_dir(work, name, losses, device_spans=True):
    write(work, f"{name}/summary.json", {"test_eval_mode": {"accuracy": 0.7}, "samples_per_s": 1000.0})
    events = [{"ph": "X", "pid": 0, "tid": 0, "cat": "compute", "name": "forward", "ts": 0, "dur": 2000},
              {"ph": "X", "pid": 0, "tid": 0, "cat": "compute", "name": "backward", "ts": 2000, "dur": 2000}]
    if device_spans:
        events += [{"ph": "X", "pid": 0, "tid": 3, "cat": "device", "name": "conv2d 0", "ts": 10, "dur": 1000,
                    "args": {"what": "kernels"}},
                   {"ph": "X", "pid": 0, "tid": 3, "cat": "device", "name": "copy to host", "ts": 1500, "dur": 500,
                    "args": {"what": "copy"}}]
    write(work, f"{name}/trace.json", {"traceEvents": events})
    write(work, f"{name}/metrics.jsonl", "".join(json.dumps({"kind": "step", "rank": r, "step": s, "loss": l}) + "\n"
                                                 for (r, s), l in losses.items()))


def main():
    tmp = tempfile.mkdtemp(prefix="gpu-report-test.")

    # ---- a GPU machine ----
    work = gpu_machine(tmp)
    tests = [("CudaOps.Gemm", "passed"), ("Nccl.TwoRanks", "skipped"), ("CudaExecutor.Cnn", "passed")]
    write(work, "tests.json", gtest_report(tests))
    write(work, "tests.log", gtest_log(tests, lambda t: "needs 2 GPUs (NCCL refuses two ranks on one GPU); this machine has 1"))
    check("op_tests: the two-rank NCCL test skipped on one GPU", stage(work, "op_tests", tests=0), "passed")
    tests[2] = ("CudaExecutor.Cnn", "skipped")
    write(work, "tests.json", gtest_report(tests))
    write(work, "tests.log", gtest_log(tests, lambda t: "needs 2 GPUs" if "Nccl" in t else "no GPU: cudaGetDeviceCount"))
    check("op_tests: another test skipped on a GPU machine", stage(work, "op_tests", tests=0), "failed",
          "skipped on a GPU machine")
    tests[2] = ("CudaExecutor.Cnn", "failed")
    write(work, "tests.json", gtest_report(tests))
    check("op_tests: a failure", stage(work, "op_tests", tests=1), "failed", "CudaExecutor.Cnn")
    write(work, "tests.log", "[ RUN      ] CudaOps.Gemm\n[       OK ] CudaOps.Gemm (3 ms)\n[ RUN      ] CudaOps.Conv\n")
    os.remove(os.path.join(work, "tests.json"))
    check("op_tests: cut by the time box", stage(work, "op_tests", tests=124), "timeout", "after 1 tests")

    run_dir(work, "run-cpu", {(0, 0): 2.30, (0, 1): 2.10, (1, 0): 2.31})
    write(work, "run-cpu.log", "")
    check("training_cpu", stage(work, "training_cpu", run=0), "passed", steps=3)
    run_dir(work, "run-cuda", {(0, 0): 2.30, (0, 1): 2.1005, (1, 0): 2.31})
    write(work, "run-cuda.log", "")
    rec = stage(work, "training_cuda", run=0)
    check("training_cuda: losses beside the CPU's", rec, "passed")
    diff = rec["figures"].get("losses_vs_cpu", {})
    if not (abs(diff.get("max_abs_diff", 0) - 0.0005) < 1e-9 and diff.get("at") == {"rank": 0, "step": 1}):
        FAILED.append(f"training_cuda: losses_vs_cpu {diff}")
    if rec["figures"].get("device_timeline") != {"spans": 2, "kernels_ms": 1.0, "copies_ms": 0.5,
                                                 "host_forward_backward_ms": 4.0, "device_busy_share": 0.375}:
        FAILED.append(f"training_cuda: device_timeline {rec['figures'].get('device_timeline')}")
    run_dir(work, "run-cuda", {(0, 0): 2.30}, device_spans=False)
    check("training_cuda: a GPU run without the device's timeline", stage(work, "training_cuda", run=0), "failed",
          "no device track")
    run_dir(work, "run-cuda", {(0, 0): 2.30, (0, 1): 2.1005, (1, 0): 2.31})
    write(work, "run-cuda.log", "dtlab: error: --device cuda: no GPU: cudaGetDeviceCount found 0 devices\n  hint: check\n")
    check("training_cuda: dtlab's 'no GPU' where the gpu stage saw one", stage(work, "training_cuda", run=9), "failed",
          "yet the gpu stage found a GPU")

    write(work, "eval-weights.txt", "run-cuda")
    write(work, "eval-cpu.json", {"accuracy": 0.7, "predictions": [1, 2, 3, 4]})
    write(work, "eval-cpu.log", "")
    check("eval_cpu", stage(work, "eval_cpu", eval=0), "passed", samples=4)
    write(work, "eval-cuda.json", {"accuracy": 0.7, "predictions": [1, 2, 3, 5]})
    write(work, "eval-cuda.log", "")
    check("eval_cuda: top-1 agreement", stage(work, "eval_cuda", eval=0), "passed", top1_agreement=0.75)

    for key in ("eager", "graphs"):
        run_dir(work, f"run-{key}", {(0, 0): 2.30, (0, 1): 2.10})
        write(work, f"run-{key}.log", "")
        write(work, f"run-{key}/final.safetensors", "same bytes")
    write(work, "run-graphs/summary.json", {"device": {"rank0": {"cuda_graphs": {"captured": 1, "replayed": 18, "eager": 2}}}})
    check("cuda_graphs: the same bits, steps replayed", stage(work, "cuda_graphs", eager=0, graphs=0), "passed",
          final_weights_identical=True, losses_identical=True)
    write(work, "run-graphs/final.safetensors", "other bytes")
    check("cuda_graphs: other weights", stage(work, "cuda_graphs", eager=0, graphs=0), "failed", "final.safetensors")
    write(work, "run-graphs/final.safetensors", "same bytes")
    write(work, "run-graphs/summary.json", {"device": {"rank0": {}}})
    check("cuda_graphs: nothing replayed", stage(work, "cuda_graphs", eager=0, graphs=0), "failed", "no step was replayed")

    for model in ("cnn", "mlp"):
        write(work, f"bench-{model}.json", {"sweep": [{"batch_size": 32, "step_ms": 2.0, "samples_per_s": 16000}]})
        write(work, f"bench-{model}.log", "")
        write(work, f"bench-{model}-graphs.json", {"sweep": [{"batch_size": 32, "step_ms": 0.5, "samples_per_s": 64000}]})
        write(work, f"bench-{model}-graphs.log", "")
    check("timings_dtlab", stage(work, "timings_dtlab", **{"bench-cnn": 0, "bench-mlp": 0, "bench-cnn-graphs": 0,
                                                           "bench-mlp-graphs": 0}), "passed")
    write(work, "torch-bench.log", "# torch 2.11\n model  batch  eager_ms  graph_ms compile_ms\n"
                                   "   cnn     32     4.000     1.000          -\n")
    rec = stage(work, "timings_torch", torch=124)
    check("timings_torch: cut short, the printed rows kept", rec, "timeout")
    table = rec["figures"].get("table", [])
    if not (len(table) == 1 and table[0]["dtlab_over_torch_eager"] == 0.5 and table[0]["dtlab_over_torch_best"] == 2.0
            and table[0]["dtlab_graph_ms"] == 0.5 and table[0]["dtlab_graph_over_torch_graph"] == 0.5):
        FAILED.append(f"timings_torch: table {table}")

    for algo in ("nccl", "ring"):
        run_dir(work, f"run-nccl-{algo}", {(0, 0): 2.3})
        write(work, f"run-nccl-{algo}.log", "")
    write(work, "run-nccl-two-on-one.log", "dtlab: error: --comm nccl: rank 1 needs cuda:1, and this process sees 1 GPU\n"
                                           "  hint: NCCL refuses two ranks on one GPU, so --comm nccl --world-size 2 needs 2 GPUs\n")
    check("nccl: one rank, and two on one GPU refused", stage(work, "nccl", **{"nccl-nccl": 0, "nccl-ring": 0, "two-on-one": 9}),
          "passed")
    write(work, "run-nccl-two-on-one.log", "")
    check("nccl: two ranks on one GPU not refused", stage(work, "nccl", **{"nccl-nccl": 0, "nccl-ring": 0, "two-on-one": 0}),
          "failed", "expected exit 9")

    write(work, "allreduce.log", "")
    write(work, "allreduce.json", {"results": {"2": {"ring": [{"bytes": 4096, "time_us": 20.0, "busbw_gbps": 0.2, "wrong": 0}],
                                                     "copy_floor": [{"bytes": 4096, "time_us": 5.0, "algbw_gbps": 0.8}]}}})
    rec = stage(work, "allreduce", allreduce=0)
    check("allreduce: the ring beside the copy", rec, "passed")
    if rec["figures"].get("table", [{}])[0].get("copy_over_ring") != 0.25:
        FAILED.append(f"allreduce: table {rec['figures'].get('table')}")
    write(work, "allreduce.json", {"results": {"2": {"ring": [{"bytes": 4096, "time_us": 20.0, "busbw_gbps": 0.2, "wrong": 3}],
                                                     "copy_floor": [{"bytes": 4096, "time_us": 5.0, "algbw_gbps": 0.8}]}}})
    check("allreduce: a wrong sum", stage(work, "allreduce", allreduce=0), "failed", "3 elements off the exact sum")

    write(work, "memcheck.list", "CudaOps.\n  Gemm\n  Conv\n")
    write(work, "memcheck.log", "[ RUN      ] CudaOps.Gemm\n[       OK ] CudaOps.Gemm (30 ms)\n[ RUN      ] CudaOps.Conv\n")
    check("memcheck: out of time, clean so far", stage(work, "memcheck", memcheck=124), "partial", "after 1 of 2 tests",
          tests_completed=1, tests_total=2)
    write(work, "memcheck.log", "[ RUN      ] CudaOps.Gemm\n[       OK ] CudaOps.Gemm (30 ms)\n[ RUN      ] CudaOps.Conv\n"
                                "[  FAILED  ] CudaOps.Conv, where GetParam() = \"cnn\" (40 ms)\n"
                                "[  FAILED  ] 1 test, listed below:\n[  FAILED  ] CudaOps.Conv, where GetParam() = \"cnn\"\n"
                                " 1 FAILED TEST\n"
                                "========= Target application returned an error\n========= ERROR SUMMARY: 0 errors\n")
    check("memcheck: clean, a test failing its own check", stage(work, "memcheck", memcheck=1), "passed",
          "1 of them failed", errors=0, tests_failed=["CudaOps.Conv"])
    write(work, "memcheck.log", "[ RUN      ] CudaOps.Gemm\n========= Invalid __global__ read of size 4 bytes\n"
                                "[       OK ] CudaOps.Gemm (30 ms)\n========= ERROR SUMMARY: 1 error\n")
    check("memcheck: an invalid read", stage(work, "memcheck", memcheck=86), "failed", "Invalid __global__ read", errors=1)
    write(work, "racecheck.list", "CudaOps.\n  Gemm\n")
    write(work, "racecheck.log", "========= Error: Race reported between Write access at 0x10 in block_sum\n"
                                 "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    check("racecheck: a race", stage(work, "racecheck", racecheck=86), "failed", "Race reported", errors=1)

    # ---- no GPU (the rehearsal) ----
    work = init(tmp, expect_no_gpu=True)
    write(work, "version.txt", "dtlab 0.1.0\nGPU devices: none (no CUDA driver: cudaGetDeviceCount returned "
                               "cudaErrorInsufficientDriver)\n")
    check("gpu: no driver", stage(work, "gpu", smi=127, version=0), "no-gpu")
    tests = [("CudaOps.Gemm", "skipped"), ("CudaExecutor.Cnn", "skipped")]
    write(work, "tests.json", gtest_report(tests))
    write(work, "tests.log", gtest_log(tests, lambda t: "no GPU: no CUDA driver (cudaErrorInsufficientDriver)"))
    check("op_tests: every test skipped with the probe's no-GPU reason", stage(work, "op_tests", tests=0), "no-gpu")
    write(work, "tests.log", gtest_log(tests, lambda t: "cuDNN handle: CUDNN_STATUS_NOT_INITIALIZED"))
    check("op_tests: skipped for another reason", stage(work, "op_tests", tests=0), "failed",
          "skipped for another reason than no GPU")
    os.remove(os.path.join(work, "tests.json"))
    write(work, "tests.log", "dtlab_cuda_ops_tests: error while loading shared libraries: libcudnn.so.9: cannot open\n")
    check("op_tests: the binary did not start", stage(work, "op_tests", tests=127), "failed", "libcudnn.so.9")
    write(work, "run-cuda.log", "dtlab: error: --device cuda: cannot load the GPU backend module /p/libdtlab_cuda_exec.so: "
                                "libcublas.so.13: cannot open shared object file\n  hint: ...\n")
    check("training_cuda: the module cannot load is not 'no GPU'", stage(work, "training_cuda", run=9), "failed",
          "cannot load the GPU backend module")
    write(work, "run-cuda.log", "dtlab: error: --device cuda: no CUDA driver: cudaGetDeviceCount returned ...\n")
    check("training_cuda: no driver", stage(work, "training_cuda", run=9), "no-gpu")
    write(work, "torch-bench.log", "gpu_train_bench: --device cuda: torch 1.13.0 sees no GPU\n")
    check("timings_torch: no GPU", stage(work, "timings_torch", torch=2), "no-gpu")
    check("memcheck: not run without a GPU", stage(work, "memcheck"), "no-gpu")
    r = report("verdict", work)
    if r.returncode == 0:
        FAILED.append("verdict: a rehearsal with stages not reached passed")
    print(f"{'ok' if r.returncode else 'FAILED'}: verdict: stages not reached fail the rehearsal")

    # ---- pack: libraries ----
    pack = tempfile.mkdtemp(dir=tmp)
    write(pack, "manifest.json", {"files": ["bin/dtlab"], "glibc_required": "2.17", "cuda_arch": "sm_90"})
    write(pack, "bin/dtlab", "")
    write(pack, "bin/module_imports.txt", "_ZN3lab5ModelE\n")
    for expect_no_gpu, status in ((True, "failed"), (False, "passed")):
        work = init(tmp, expect_no_gpu=expect_no_gpu, pack=pack)
        meta = json.load(open(os.path.join(work, "meta.json")))
        meta["ld_library_path"] = "/site/nvidia/cu13/lib:/site/nvidia/nccl/lib"
        write(work, "meta.json", meta)
        write(work, "ldd-dtlab.txt", "\tlibcudart.so.13 => /site/nvidia/cu13/lib/libcudart.so.13 (0x1)\n"
                                     "\tlibnccl.so.2 => /usr/local/cuda-13.0/lib/libnccl.so.2 (0x2)\n")
        write(work, "ldd-libdtlab_cuda_exec.so.txt", "\tundefined symbol: _ZN3lab5ModelE\t(/p/libdtlab_cuda_exec.so)\n")
        check(f"pack: a CUDA library through the system's cache ({'rehearsal' if expect_no_gpu else 'device'})",
              stage(work, "pack", ldd=0), status, "libnccl.so.2 is not in the CUDA library folders")
    write(work, "ldd-dtlab.txt", "\tlibcudnn.so.9 => not found\n")
    write(work, "ldd-libdtlab_cuda_exec.so.txt", "\tundefined symbol: cudnnNewThing, version libcudnn.so.9\t(/p/m.so)\n")
    rec = stage(work, "pack", ldd=0)
    check("pack: a library not found, a symbol the machine's cuDNN lacks", rec, "failed", "libcudnn.so.9 => not found")
    if "cudnnNewThing" not in json.dumps(rec["figures"].get("unresolved")):
        FAILED.append("pack: the module's missing cuDNN symbol is not reported")
    os.remove(os.path.join(pack, "bin/dtlab"))
    check("pack: a file missing", stage(work, "pack", ldd=0), "failed", "missing from the pack: bin/dtlab")

    if FAILED:
        print(f"test_report: {len(FAILED)} case(s) FAILED:\n  " + "\n  ".join(FAILED))
        sys.exit(1)
    print("test_report: every case passed")


if __name__ == "__main__":
    main()
