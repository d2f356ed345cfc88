#!/usr/bin/env python3
"""gpu_check.json: the verdict and figures of tools/gpu_check.sh, one stage at a time.

tools/gpu_check.sh runs each stage's commands (with their time box) and leaves their logs and
outputs in its work folder; then it calls

    report.py stage WORK NAME --seconds S --budget B [--rc KEY=RC ...]

which reads what the stage left, decides its status and figures, appends the stage to
WORK/stages.jsonl, rewrites the JSON (WORK/meta.json names it) and prints one line. So the JSON
holds every finished stage even when a later stage, or the device's time, runs out.

    report.py init WORK --out FILE --mode MODE --data DIR [--pack DIR] [--budget S] [--expect-no-gpu]
    report.py skip WORK NAME --why TEXT            a stage that was not run (out of time, ...)
    report.py verdict WORK                         the summary; exit 0 when the check passed

A stage's status: "passed"; "failed" (with the reason); "timeout" (its time box ran out); "partial"
(a sanitizer out of time with no error so far: its coverage is recorded); "no-gpu" (the stage needs
a GPU and met the clean no-GPU answer: no driver, no device); "not-run". The check passes when
every stage passed, a sanitizer's "partial" excepted. Expecting no GPU (--expect-no-gpu:
tools/gpu_check.sh --rehearse, on a machine without a GPU), it passes when every stage that needs
no GPU passed and every GPU stage answered "no-gpu": a missing library, file or tool fails the
rehearsal as it would fail the real run.
"""
import argparse
import json
import os
import re
import sys
import time

# (name, needs a GPU, what it checks), in the order gpu_check.sh runs them: by value, the
# sanitizers last with whatever time is left.
STAGES = [
    ("pack", False, "the binaries, their libraries (ldd -r), glibc, the dataset (or the build, when built here)"),
    ("gpu", True, "nvidia-smi and dtlab's own probe see the GPU; versions of the driver and libraries"),
    ("op_tests", True, "every op and the executor against the CPU reference (tests/gpu), once"),
    ("training_cpu", False, "the short training run on the CPU (the reference of training_cuda)"),
    ("training_cuda", True, "the same run on the GPU (2 emulated ranks, SyncBN): losses beside the CPU's, and the device's own timeline"),
    ("eval_cpu", False, "the trained weights evaluated on the CPU over the whole test set"),
    ("eval_cuda", True, "the same weights on the GPU: accuracy and top-1 agreement with the CPU"),
    ("cuda_graphs", True, "one rank's cnn run step by step and with --cuda-graphs on the GPU (--cudnn-deterministic): the same bits (weights, losses), steps replayed"),
    ("timings_dtlab", True, "dtlab bench train --device cuda, cnn and mlp at batch 32, 64, 256, step by step and with --cuda-graphs"),
    ("timings_torch", True, "PyTorch eager and CUDA Graph steps on the same GPU (tools/torch/gpu_train_bench.py)"),
    ("nccl", True, "--comm nccl with one rank (NCCL's allreduce and the ring); two ranks on one GPU refused"),
    ("allreduce", True, "dtlab bench allreduce --device cuda: emulated ranks' ring on device buffers beside a device-to-device copy of the same bytes"),
    ("memcheck", True, "compute-sanitizer memcheck over the op tests (partial coverage recorded)"),
    ("racecheck", True, "compute-sanitizer racecheck over the hand-written kernels (partial coverage recorded)"),
]
GPU_STAGE = {name: gpu for name, gpu, _ in STAGES}
WHAT = {name: what for name, _, what in STAGES}
NO_GPU = re.compile(r"no CUDA driver|no GPU")
CUDA_LIB = re.compile(r"lib(cu|nccl|nvrtc|nvJitLink)")  # what the nvidia-* wheels ship


def read(path, limit=None):
    try:
        with open(path, errors="replace") as f:
            return f.read() if limit is None else f.read()[-limit:]
    except OSError:
        return ""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(text, lines=6):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def dtlab_error(text):
    """dtlab's own error line and hint, or the loader's complaint, or the log's tail."""
    lines = [l for l in text.splitlines() if l.startswith("dtlab: error:") or l.strip().startswith("hint:")]
    if lines:
        return " / ".join(l.strip() for l in lines)
    loader = [l for l in text.splitlines() if "error while loading shared libraries" in l or "not found" in l]
    return " / ".join(loader[:3]) if loader else tail(text, 3)


def outcome(rc, log_path):
    """(status, note) of one dtlab command: passed, no-gpu (exit 9 with the probe's no-GPU
    message), timeout, or failed with its message."""
    text = read(log_path)
    if rc == 0:
        return "passed", ""
    if rc in (124, 137):
        return "timeout", f"cut by its time box (exit {rc}; log: {os.path.basename(log_path)})"
    if rc == 9 and NO_GPU.search(dtlab_error(text)):
        return "no-gpu", dtlab_error(text).split(" / ")[0].replace("dtlab: error: ", "")
    return "failed", f"exit {rc}: {dtlab_error(text)} (log: {os.path.basename(log_path)})"


def combine(parts):
    """One status from several commands: failed and timeout win over no-gpu, no-gpu over passed."""
    for s in ("failed", "timeout", "no-gpu", "partial", "not-run"):
        if any(p == s for p in parts):
            return s
    return "passed"


class Stage:
    def __init__(self, work, name, rc, meta):
        self.work, self.name, self.rc, self.meta = work, name, rc, meta
        self.status, self.notes, self.figures = "passed", [], {}

    def path(self, *p):
        return os.path.join(self.work, *p)

    def set(self, status, note=""):
        self.status = combine([self.status, status])
        if note:
            self.notes.append(note)

    def gpu_found(self):
        gpu = previous(self.work, "gpu")
        return bool(gpu and gpu.get("figures", {}).get("devices"))

    def outcome(self, rc, log_path):
        """outcome(), where a GPU the gpu stage found makes dtlab's "no GPU" a failure."""
        status, note = outcome(rc, log_path)
        if status == "no-gpu" and self.gpu_found():
            return "failed", f"dtlab says '{note}', yet the gpu stage found a GPU"
        return status, note


def previous(work, name):
    """The record of an earlier stage of this check, or None."""
    return next((r for r in records(work) if r["name"] == name), None)


# ---- the stages ----

def stage_pack(s):
    if s.meta.get("mode") == "built here":
        if s.rc.get("build", 1) != 0:
            s.set("failed", f"the build failed (exit {s.rc.get('build')}): {tail(read(s.path('build.log')), 8)}")
        check_data(s)
        return
    manifest = load_json(os.path.join(s.meta["pack"], "manifest.json"))
    if manifest is None:
        s.set("failed", "no manifest.json in the pack: make it with tools/gpu_check.sh --pack")
        return
    pack = s.meta["pack"]
    s.figures["commit"] = manifest.get("commit")
    s.figures["built"] = manifest.get("date")
    missing = [f for f in manifest.get("files", []) if not os.path.isfile(os.path.join(pack, f))]
    if missing:
        s.set("failed", "missing from the pack: " + ", ".join(missing))
    # glibc: the newest symbol version the binaries need against this machine's
    need = manifest.get("glibc_required", "0")
    have = os.confstr("CS_GNU_LIBC_VERSION").split()[-1] if hasattr(os, "confstr") else "?"
    s.figures["glibc"] = {"required": need, "here": have}
    version = lambda v: tuple(int(x) for x in re.findall(r"\d+", v))  # noqa: E731
    if have != "?" and version(have) < version(need):
        s.set("failed", f"the pack needs glibc {need}, this machine has {have}: build the pack on an older system")
    # every library and symbol resolves (ldd -r), the module's lab symbols excepted: dtlab exports them
    imports = set(read(os.path.join(pack, "bin", "module_imports.txt")).split())
    unresolved = {}
    for name in ("dtlab", "dtlab_cuda_ops_tests", "libdtlab_cuda_exec.so"):
        text = read(s.path(f"ldd-{name}.txt"))
        if not text:
            continue
        bad = [l.strip() for l in text.splitlines() if "not found" in l]
        for l in text.splitlines():
            m = re.match(r"\s*undefined symbol: (\S+)", l)
            if m and not (name == "libdtlab_cuda_exec.so" and m.group(1) in imports):
                bad.append(l.strip())
        if bad:
            unresolved[name] = bad[:20]
    # the CUDA libraries from the library folders the check chose (the wheels'), not through the
    # system's library cache (ld.so.conf): a rehearsal machine's toolkit would hide one the wheels lack
    lib_dirs = {os.path.abspath(d) for d in s.meta.get("ld_library_path", "").split(":") if d}
    elsewhere = {}
    for name in ("dtlab", "dtlab_cuda_ops_tests", "libdtlab_cuda_exec.so"):
        for l in read(s.path(f"ldd-{name}.txt")).splitlines():
            m = re.match(r"\s*(\S+) => (/\S+)", l)
            if m and CUDA_LIB.match(m.group(1)) and os.path.dirname(os.path.abspath(m.group(2))) not in lib_dirs:
                elsewhere[m.group(1)] = m.group(2)
    for soname, path in sorted(elsewhere.items()):
        note = (f"{soname} is not in the CUDA library folders (the nvidia-* wheels'): the loader found {path} "
                "instead, through the system's library cache")
        if s.meta["expect_no_gpu"]:
            s.set("failed", note + ", which the GPU machine may not have")
        else:
            s.notes.append(note)
    s.figures["found_outside_library_dirs"] = elsewhere
    if unresolved:
        s.figures["unresolved"] = unresolved
        first = "; ".join(f"{k}: {v[0]}" for k, v in unresolved.items())
        s.set("failed", f"libraries or symbols missing: {first} (LD_LIBRARY_PATH={s.meta.get('ld_library_path', '')})")
    if s.rc.get("ldd", 0) == 127:
        s.notes.append("ldd is not installed here: the libraries are checked by the stages' own loads")
    check_data(s)
    s.figures["dataset"] = manifest.get("data")


def check_data(s):
    data = s.meta["data"]
    files = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz"]
    absent = [f for f in files if not os.path.isfile(os.path.join(data, f))]
    if absent:
        s.set("failed", f"the dataset is incomplete in {data}: {', '.join(absent)} missing")


def stage_gpu(s):
    smi = read(s.path("nvidia-smi.txt")).strip()
    version = read(s.path("version.txt"))
    rc_version = s.rc.get("version", 1)
    s.figures["dtlab_version"] = [l for l in version.splitlines() if l.strip()]
    s.figures["compute_sanitizer"] = read(s.path("sanitizer-path.txt")).strip() or None
    devices = [l for l in read(s.path("nvidia-smi-L.txt")).splitlines() if l.startswith("GPU ")]
    if rc_version != 0:
        s.set("failed", f"dtlab version exit {rc_version}: {dtlab_error(version)}")
        return
    probe = next((l for l in version.splitlines() if l.startswith("GPU devices:")), "")
    s.figures["probe"] = probe
    m = re.search(r"GPU backend: (.*)", version)
    s.figures["backend"] = m.group(1) if m else None
    if not devices:
        why = "nvidia-smi is not installed" if s.rc.get("smi", 0) == 127 else f"nvidia-smi lists none ({smi})"
        if "none (" in probe and NO_GPU.search(probe):
            s.set("no-gpu", f"{why}; dtlab: {probe}")
        else:
            s.set("failed", f"{why}, but dtlab's probe says: {probe}")
        return
    name, driver, cc, mem = (smi.splitlines()[0].split(", ") + [""] * 4)[:4]
    s.figures.update({"name": name, "driver": driver, "compute_capability": cc, "memory": mem,
                      "devices": len(devices)})
    if "none (" in probe:
        s.set("failed", f"nvidia-smi lists {len(devices)} GPU(s) but dtlab's probe sees none: {probe}")
    arch = s.meta.get("cuda_arch", "")
    if arch and cc and cc.replace(".", "") not in arch.replace("sm_", "").replace(" ", "").split(","):
        s.set("failed", f"the GPU is compute capability {cc}; the binaries hold code for {arch}: "
                        f"rebuild the pack with tools/gpu_check.sh --pack --arch {cc.replace('.', '')}")


def test_results(log_text, report):
    """[(name, result, seconds, message)] from gtest's JSON report, skip messages from the log."""
    skips, current, buf = {}, None, []
    for line in log_text.splitlines():
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            current, buf = m.group(1), []
            continue
        m = re.match(r"\[  SKIPPED \] (\S+)", line)
        if m and current == m.group(1):
            skips[current] = " ".join(l.strip() for l in buf if not l.endswith(": Skipped")).strip()
            current = None
            continue
        if current:
            buf.append(line)
    out = []
    for suite in (report or {}).get("testsuites", []):
        for t in suite.get("testsuite", []):
            full = suite["name"] + "." + t["name"]
            failures = [f.get("failure", "") for f in t.get("failures", [])]
            result = "failed" if failures else ("skipped" if t.get("result") == "SKIPPED" else "passed")
            out.append({"name": full, "result": result, "seconds": float(str(t.get("time", "0s")).rstrip("s")),
                        **({"failures": failures} if failures else {}),
                        **({"skipped": skips.get(full, "")} if result == "skipped" else {})})
    return out


def stage_op_tests(s):
    rc = s.rc.get("tests", 1)
    log = read(s.path("tests.log"))
    report = load_json(s.path("tests.json"))
    tests = test_results(log, report)
    s.figures["backend"] = [l[2:].strip() for l in log.splitlines() if l.startswith("# ")]
    counts = {r: sum(1 for t in tests if t["result"] == r) for r in ("passed", "failed", "skipped")}
    s.figures["counts"] = {**counts, "total": len(tests), "exit_code": rc}
    s.figures["tests"] = tests
    recorded = {}
    std = {"name", "status", "result", "timestamp", "time", "classname", "failures", "file", "line",
           "value_param", "type_param"}
    for suite in (report or {}).get("testsuites", []):
        for t in suite.get("testsuite", []):
            extra = {k: v for k, v in t.items() if k not in std}
            if extra:
                recorded[suite["name"] + "." + t["name"]] = extra
    s.figures["recorded"] = recorded  # RecordProperty: the errors measured, the algorithms cuDNN chose
    if rc in (124, 137):
        done = len(re.findall(r"^\[ +(OK|FAILED|SKIPPED) +\] \S+ \(", log, re.M))
        s.set("timeout", f"cut by its time box after {done} tests")
        return
    if report is None:
        s.set("failed", f"no JSON report; the op tests exited with {rc}: {dtlab_error(log)}")
        return
    if counts["failed"]:
        s.set("failed", "failed: " + ", ".join(t["name"] for t in tests if t["result"] == "failed"))
    skipped = [t for t in tests if t["result"] == "skipped"]
    if not s.gpu_found():
        # no GPU: the binary must have started (every library loaded) and skipped with the probe's reason
        odd = [t for t in skipped if not NO_GPU.search(t["skipped"])]
        if odd:
            s.set("failed", f"{odd[0]['name']} skipped for another reason than no GPU: {odd[0]['skipped']}")
        elif rc == 0 and not counts["failed"]:
            s.set("no-gpu", f"the tests started and skipped: {skipped[0]['skipped'] if skipped else ''}")
        elif not counts["failed"]:
            s.set("failed", f"the op tests exited with {rc}: {tail(log, 3)}")
        return
    # a GPU: a skip is a failure (the probe did not see the GPU), except the two-rank NCCL tests on one GPU
    bad = [t for t in skipped if "needs 2 GPUs" not in t["skipped"]]
    if bad:
        s.set("failed", f"{len(bad)} test(s) skipped on a GPU machine, e.g. {bad[0]['name']}: {bad[0]['skipped']}")
    if rc != 0 and not counts["failed"]:
        s.set("failed", f"the op tests exited with {rc}: {tail(log, 3)}")
    if counts["passed"] == 0:
        s.set("failed", "no test passed")


def run_summary(run_dir):
    sm = load_json(os.path.join(run_dir, "summary.json")) or {}
    keys = ("test_eval_mode", "test_train_mode", "samples_per_s", "device")
    return {k: sm.get(k) for k in keys if k in sm}


def losses(run_dir):
    """{(rank, step): loss} from the run's metrics.jsonl."""
    out = {}
    for line in read(os.path.join(run_dir, "metrics.jsonl")).splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "step" and "loss" in r:
            out[(r["rank"], r["step"])] = r["loss"]
    return out


def device_timeline(run_dir):
    """What the GPU did during the run's forward and backward passes, from trace.json's device
    track (tid 3: each layer's kernels and each copy, timed by CUDA events), beside the host's
    time in the same passes; None when the trace has no device spans."""
    trace = load_json(os.path.join(run_dir, "trace.json")) or {}
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    dev = [e for e in events if e.get("cat") == "device"]
    if not dev:
        return None
    host_ms = sum(e.get("dur", 0) for e in events
                  if e.get("cat") == "compute" and e.get("name") in ("forward", "backward")) / 1000
    kernels_ms = sum(e.get("dur", 0) for e in dev if e.get("args", {}).get("what") == "kernels") / 1000
    copies_ms = sum(e.get("dur", 0) for e in dev if e.get("args", {}).get("what") == "copy") / 1000
    return {"spans": len(dev), "kernels_ms": round(kernels_ms, 3), "copies_ms": round(copies_ms, 3),
            "host_forward_backward_ms": round(host_ms, 3),
            "device_busy_share": round((kernels_ms + copies_ms) / host_ms, 4) if host_ms > 0 else None}


def stage_training(s, device):
    run = s.path(f"run-{device}")
    status, note = s.outcome(s.rc.get("run", 1), s.path(f"run-{device}.log"))
    s.set(status, note)
    if status != "passed":
        return
    s.figures.update(run_summary(run))
    mine = losses(run)
    s.figures["steps"] = len(mine)
    if device == "cuda":
        timeline = device_timeline(run)
        if timeline:
            s.figures["device_timeline"] = timeline
        else:
            s.set("failed", "the GPU run's trace.json has no device track (tid 3): the executor's CUDA-event spans are missing")
        cpu = losses(s.path("run-cpu"))
        common = sorted(set(cpu) & set(mine))
        if common:
            diffs = [abs(cpu[k] - mine[k]) for k in common]
            worst = max(range(len(common)), key=lambda i: diffs[i])
            s.figures["losses_vs_cpu"] = {
                "steps_compared": len(common), "max_abs_diff": max(diffs),
                "at": {"rank": common[worst][0], "step": common[worst][1]},
                "first_step": {"cpu": cpu[common[0]], "cuda": mine[common[0]]},
                "last_step": {"cpu": cpu[common[-1]], "cuda": mine[common[-1]]}}
            s.figures["cpu"] = run_summary(s.path("run-cpu"))
        else:
            s.notes.append("no CPU losses to compare with (training_cpu did not finish)")


def stage_eval(s, device):
    status, note = s.outcome(s.rc.get("eval", 1), s.path(f"eval-{device}.log"))
    s.set(status, note)
    s.figures["weights"] = read(s.path("eval-weights.txt")).strip()
    ev = load_json(s.path(f"eval-{device}.json"))
    if status != "passed" or not ev:
        return
    s.figures.update({"accuracy": ev.get("accuracy"), "loss": ev.get("loss"), "samples": len(ev.get("predictions", [])),
                      "samples_per_s": ev.get("samples_per_s")})
    if device == "cuda":
        cpu = load_json(s.path("eval-cpu.json"))
        if cpu:
            a, b = cpu["predictions"], ev["predictions"]
            s.figures["top1_agreement"] = sum(x == y for x, y in zip(a, b)) / max(1, len(a))
            s.figures["cpu_accuracy"] = cpu.get("accuracy")


def stage_cuda_graphs(s):
    parts = []
    for key in ("eager", "graphs"):  # (the second runs only when the first passed)
        if key not in s.rc:
            continue
        status, note = s.outcome(s.rc[key], s.path(f"run-{key}.log"))
        s.set(status, f"{key}: {note}" if note else "")
        parts.append(status)
    if parts != ["passed", "passed"]:
        return

    def data(f):
        try:
            with open(s.path(f), "rb") as fh:
                return fh.read()
        except OSError:
            return b""
    eager, graphs = data("run-eager/final.safetensors"), data("run-graphs/final.safetensors")
    le, lg = losses(s.path("run-eager")), losses(s.path("run-graphs"))
    summary = load_json(s.path("run-graphs", "summary.json")) or {}
    counters = ((summary.get("device") or {}).get("rank0") or {}).get("cuda_graphs")
    s.figures.update({"steps": len(lg), "final_weights_identical": bool(eager) and eager == graphs,
                      "losses_identical": bool(lg) and le == lg, "cuda_graphs": counters,
                      "samples_per_s": {"eager": run_summary(s.path("run-eager")).get("samples_per_s"),
                                        "graphs": run_summary(s.path("run-graphs")).get("samples_per_s")}})
    if not s.figures["final_weights_identical"]:
        s.set("failed", "the --cuda-graphs run's final.safetensors is not the step-by-step run's")
    if not s.figures["losses_identical"]:
        s.set("failed", "the --cuda-graphs run's losses are not the step-by-step run's")
    if not counters or counters.get("replayed", 0) < 1:
        s.set("failed", f"no step was replayed from a CUDA Graph (summary.json device.rank0.cuda_graphs: {counters})")


def stage_timings_dtlab(s):
    for model in ("cnn", "mlp"):
        for key, name in ((f"bench-{model}", model), (f"bench-{model}-graphs", f"{model}_graphs")):
            if key not in s.rc:
                continue
            status, note = s.outcome(s.rc[key], s.path(f"{key}.log"))
            s.set(status, f"{name}: {note}" if note else "")
            bench = load_json(s.path(f"{key}.json"))
            if bench:
                s.figures[name] = [{k: r.get(k) for k in ("batch_size", "step_ms", "samples_per_s")}
                                   for r in bench.get("sweep", [])]


def torch_rows(s):
    bench = load_json(s.path("torch-bench.json"))
    if bench:
        return bench["rows"], {k: bench.get(k) for k in ("torch", "device_name", "cudnn")}
    rows = []  # cut short: the rows it printed
    for line in read(s.path("torch-bench.log")).splitlines():
        m = re.match(r"\s*(cnn|mlp)\s+(\d+)\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)\s*$", line)
        if m:
            num = lambda v: None if v == "-" else float(v)  # noqa: E731
            rows.append({"model": m.group(1), "batch_size": int(m.group(2)), "eager_ms": float(m.group(3)),
                         "cuda_graph_ms": num(m.group(4)), "compile_ms": num(m.group(5))})
    return rows, {}


def stage_timings_torch(s):
    rc = s.rc.get("torch", 1)
    log = read(s.path("torch-bench.log"))
    rows, about = torch_rows(s)
    s.figures.update(about)
    if rc == 77:  # a rehearsal's python3 may lack torch; the device's has it
        s.set("no-gpu" if s.meta["expect_no_gpu"] else "failed",
              "python3 has no torch (tools/torch/gpu_train_bench.py exit 77)")
    elif rc == 2 and "sees no GPU" in log:
        s.set("failed" if s.gpu_found() else "no-gpu", tail(log, 1))
    elif rc in (124, 137):
        s.set("timeout", f"cut by its time box after {len(rows)} rows")
    elif rc != 0:
        s.set("failed", f"exit {rc}: {tail(log, 4)}")
    dtlab = previous(s.work, "timings_dtlab") or {}
    table = []
    for row in rows:
        def step_ms(name):
            return next((r["step_ms"] for r in dtlab.get("figures", {}).get(name, [])
                         if r["batch_size"] == row["batch_size"]), None)
        mine, graphed = step_ms(row["model"]), step_ms(row["model"] + "_graphs")
        best = min(v for v in (row["eager_ms"], row["cuda_graph_ms"], row["compile_ms"]) if v is not None)
        torch_graph = row["cuda_graph_ms"]
        table.append({**row, "dtlab_ms": mine, "dtlab_graph_ms": graphed,
                      "dtlab_over_torch_eager": mine / row["eager_ms"] if mine else None,
                      "dtlab_over_torch_best": mine / best if mine else None,
                      "dtlab_graph_over_torch_graph": graphed / torch_graph if graphed and torch_graph else None})
    s.figures["table"] = table


def stage_allreduce(s):
    if "allreduce" not in s.rc:
        s.set("not-run", "not run")
        return
    status, note = s.outcome(s.rc["allreduce"], s.path("allreduce.log"))
    s.set(status, note)
    bench = load_json(s.path("allreduce.json"))
    if status != "passed" or not bench:
        return
    table = []
    for n, per_n in sorted(bench.get("results", {}).items(), key=lambda kv: int(kv[0])):
        for ring, floor in zip(per_n.get("ring", []), per_n.get("copy_floor", [])):
            table.append({"ranks": int(n), "bytes": ring["bytes"], "ring_us": ring["time_us"],
                          "ring_busbw_gbps": ring["busbw_gbps"], "copy_us": floor["time_us"],
                          "copy_over_ring": floor["time_us"] / ring["time_us"], "wrong": ring["wrong"]})
            if ring["wrong"]:
                s.set("failed", f"{n} ranks, {ring['bytes']} bytes: {ring['wrong']} elements off the exact sum")
    s.figures["table"] = table


def stage_nccl(s):
    parts = []
    for algo in ("nccl", "ring"):
        key = f"nccl-{algo}"
        if key in s.rc:
            status, note = s.outcome(s.rc[key], s.path(f"run-{key}.log"))
            parts.append(status)
            if note:
                s.notes.append(f"--allreduce {algo}: {note}")
            if status == "passed":
                s.figures[algo] = run_summary(s.path(f"run-{key}"))
    if "two-on-one" in s.rc:
        rc = s.rc["two-on-one"]
        text = read(s.path("run-nccl-two-on-one.log"))
        refused = rc == 9 and "needs 2 GPUs" in text
        s.figures["two_ranks_on_one_gpu"] = {"exit_code": rc, "refused": refused, "message": dtlab_error(text)}
        parts.append("passed" if refused else "failed")
        if not refused:
            s.notes.append(f"two NCCL ranks on one GPU: expected exit 9 saying 'needs 2 GPUs', got exit {rc}: "
                           f"{dtlab_error(text)}")
    status = combine(parts) if parts else "not-run"
    if status == "no-gpu" and s.gpu_found():
        status = "failed"
    s.status = status


def stage_sanitizer(s, tool):
    if tool not in s.rc:
        s.set("failed" if s.gpu_found() else "no-gpu", "not run: the gpu stage found no GPU")
        return
    rc = s.rc[tool]
    log = read(s.path(f"{tool}.log"))
    listed = [l for l in read(s.path(f"{tool}.list")).splitlines() if l.startswith("  ")]
    done = re.findall(r"^\[ +(?:OK|FAILED|SKIPPED) +\] ([^\s,]+)(?:,.*)? \(\d+ ms\)$", log, re.M)
    summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)", log)
    reports = [l for l in log.splitlines() if re.match(r"========= (Invalid|Error|Race|Uninitialized|Barrier|"
                                                        r"Program hit|Leaked|Malloc|Out-of-range|Misaligned)", l)]
    s.figures.update({"exit_code": rc, "tests_total": len(listed), "tests_completed": len(done),
                      "errors": int(summary[-1]) if summary else len(reports),
                      "finished": bool(summary), "first_reports": reports[:10],
                      "tool": read(s.path("sanitizer-path.txt")).strip() or None})
    if rc == 127:
        s.set("failed", "compute-sanitizer not found (PATH, /usr/local/cuda/bin)")
    elif rc in (124, 137):
        s.figures["partial"] = True
        s.set("failed" if reports else "partial", f"out of time after {len(done)} of {len(listed)} tests; {len(reports)} error(s) reported so far")
    elif rc != 0 and rc != 86 and summary and s.figures["errors"] == 0 and not reports:
        # the sanitizer finished clean (its own exit code for errors is 86): the test binary's exit
        # code is its failed tests, which op_tests reports; this stage's question is memory / races
        failed = sorted(set(re.findall(r"^\[  FAILED  \] ([^\s,]+)(?:,.*)? \(\d+ ms\)$", log, re.M)))
        s.figures["tests_failed"] = failed
        s.notes.append(f"no error in {len(done)} tests; {len(failed)} of them failed their own checks (op_tests reports them)")
    elif rc != 0:
        s.set("failed", f"exit {rc}: {s.figures['errors']} error(s); " + (reports[0] if reports else tail(log, 3)))


DECIDE = {
    "pack": stage_pack, "gpu": stage_gpu, "op_tests": stage_op_tests,
    "training_cpu": lambda s: stage_training(s, "cpu"), "training_cuda": lambda s: stage_training(s, "cuda"),
    "eval_cpu": lambda s: stage_eval(s, "cpu"), "eval_cuda": lambda s: stage_eval(s, "cuda"),
    "cuda_graphs": stage_cuda_graphs,
    "timings_dtlab": stage_timings_dtlab, "timings_torch": stage_timings_torch, "nccl": stage_nccl,
    "allreduce": stage_allreduce,
    "memcheck": lambda s: stage_sanitizer(s, "memcheck"), "racecheck": lambda s: stage_sanitizer(s, "racecheck"),
}


# ---- the JSON ----

def records(work):
    return [json.loads(l) for l in read(os.path.join(work, "stages.jsonl")).splitlines() if l.strip()]


def problems(recs, expect_no_gpu):
    """(what fails the check, what is partial): every stage must pass; a sanitizer may be partial (out
    of time with no error so far). Expecting no GPU (a rehearsal): the GPU stages must answer no-gpu."""
    bad, partial, not_run = [], [], {}
    for r in recs:
        want = "no-gpu" if expect_no_gpu and r["needs_gpu"] else "passed"
        note = f": {r['notes'][0]}" if r["notes"] else ""
        if r["status"] == "partial" and not expect_no_gpu and r["name"] in ("memcheck", "racecheck"):
            partial.append(f"{r['name']}: partial{note}")
        elif r["status"] == "not-run":
            not_run.setdefault(note, []).append(r["name"])
        elif r["status"] != want:
            bad.append(f"{r['name']}: {r['status']} (expected {want}){note}")
    bad += [f"{', '.join(names)}: not run{note}" for note, names in not_run.items()]
    done = {r["name"] for r in recs}
    bad += [f"{n}: not reached" for n, _, _ in STAGES if n not in done]
    return bad, partial


def render(work):
    meta = load_json(os.path.join(work, "meta.json"))
    recs = records(work)
    done = {r["name"] for r in recs}
    out = {"date": meta["date"], "host": os.uname().nodename, "mode": meta["mode"],
           "budget_seconds": meta["budget"], "seconds_total": round(time.time() - meta["start"], 1),
           "complete": len(done) == len(STAGES), "pack": meta.get("pack_manifest"),
           "library_dirs": meta.get("ld_library_path", "").split(":"),
           "stages": recs, "stages_not_reached": [n for n, _, _ in STAGES if n not in done]}
    gpu = next((r for r in recs if r["name"] == "gpu"), None)
    if gpu:
        out["gpu"] = {k: gpu["figures"].get(k) for k in ("name", "driver", "compute_capability", "memory", "devices")}
        out["versions"] = gpu["figures"].get("backend")
    out["expect_no_gpu"] = meta["expect_no_gpu"]
    bad, partial = problems(recs, meta["expect_no_gpu"])
    out["ok"] = not bad
    out["problems"] = bad + partial
    tmp = meta["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
    os.replace(tmp, meta["out"])


def append(work, rec, quiet=False):
    with open(os.path.join(work, "stages.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    with open(os.path.join(work, "last_status"), "w") as f:  # gpu_check.sh --fail-fast reads it
        f.write(rec["status"])
    render(work)
    note = "; ".join(rec["notes"])
    if quiet:
        return
    print(f"gpu_check: {rec['name']}: {rec['status']} in {rec['seconds']:.0f} s (box {rec['budget']} s)"
          + (f": {note}" if note else ""), flush=True)


def cmd_init(a):
    os.makedirs(a.work, exist_ok=True)
    pack_manifest = load_json(os.path.join(a.pack, "manifest.json")) if a.pack else None
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "start": time.time(), "mode": a.mode, "out": a.out,
            "budget": a.budget, "pack": a.pack, "data": a.data, "expect_no_gpu": a.expect_no_gpu, "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
            "cuda_arch": (pack_manifest or {}).get("cuda_arch", a.cuda_arch or ""),
            "pack_manifest": {k: v for k, v in (pack_manifest or {}).items() if k in
                              ("commit", "date", "cuda_arch", "glibc_required", "needed", "sizes", "data")} or None}
    with open(os.path.join(a.work, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    open(os.path.join(a.work, "stages.jsonl"), "w").close()
    render(a.work)


def cmd_stage(a):
    meta = load_json(os.path.join(a.work, "meta.json"))
    rc = {}
    for kv in a.rc or []:
        k, v = kv.split("=", 1)
        rc[k] = int(v)
    s = Stage(a.work, a.name, rc, meta)
    try:
        DECIDE[a.name](s)
    except Exception as e:  # a parser's bug must not lose the stage: record it as failed
        s.set("failed", f"report.py could not read the stage's output: {type(e).__name__}: {e}")
    append(a.work, {"name": a.name, "needs_gpu": GPU_STAGE[a.name], "what": WHAT[a.name], "status": s.status,
                    "seconds": round(a.seconds, 1), "budget": a.budget, "commands": rc, "notes": s.notes,
                    "figures": s.figures})


def cmd_skip(a):
    append(a.work, {"name": a.name, "needs_gpu": GPU_STAGE[a.name], "what": WHAT[a.name], "status": "not-run",
                    "seconds": 0.0, "budget": 0, "commands": {}, "notes": [a.why], "figures": {}}, a.quiet)


def cmd_verdict(a):
    meta = load_json(os.path.join(a.work, "meta.json"))
    recs = records(a.work)
    render(a.work)
    bad, partial = problems(recs, meta["expect_no_gpu"])
    counts = {}
    for r in recs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    what = "rehearsal (no GPU expected)" if meta["expect_no_gpu"] else "check"
    print(f"gpu_check: {what} {'PASSED' if not bad else 'FAILED'}: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; {time.time() - meta['start']:.0f} s; wrote {meta['out']}")
    for b in bad + partial:
        print(f"gpu_check:   {b}")
    sys.exit(0 if not bad else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init")
    p.add_argument("work")
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--pack")
    p.add_argument("--data", required=True)
    p.add_argument("--cuda-arch")
    p.add_argument("--expect-no-gpu", action="store_true")
    p.add_argument("--budget", type=int, default=0)
    p = sub.add_parser("stage")
    p.add_argument("work")
    p.add_argument("name", choices=list(DECIDE))
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--budget", type=int, default=0)
    p.add_argument("--rc", action="append")
    p = sub.add_parser("skip")
    p.add_argument("work")
    p.add_argument("name", choices=list(DECIDE))
    p.add_argument("--why", required=True)
    p.add_argument("--quiet", action="store_true")
    p = sub.add_parser("verdict")
    p.add_argument("work")
    a = ap.parse_args()
    {"init": cmd_init, "stage": cmd_stage, "skip": cmd_skip, "verdict": cmd_verdict}[a.cmd](a)


if __name__ == "__main__":
    main()
