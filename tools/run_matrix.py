#!/usr/bin/env python3
"""A matrix of dtlab runs, recorded and compared file by file: proof that a refactoring changed no
number. Every mode (tensor parallelism included), both BatchNorm modes, ring/tree/naive, overlap on and off, no_sync, an uneven
last batch, checkpoint and resume, MPI with 2 ranks (when mpirun and the MPI transport exist), and
the seeded parameter server.

    tools/run_matrix.py record DIR [--dtlab build/dtlab] [--only NAME,...]
    tools/run_matrix.py compare DIR_A DIR_B
    tools/run_matrix.py list

`record` runs every case into DIR/<case>/ and writes, beside each run directory, what is compared:
final*.safetensors, init.safetensors and bn_stats.bin as they are; metrics.jsonl, summary.json and
config.toml with the wall-clock fields removed (t, seconds, samples_per_s, the communication and
compute seconds, and paths that name DIR). `compare` prints each case and file with "equal" or
where it differs, and ends with "all equal" (exit 0) or "N files differ" (exit 1).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SMALL = ["--limit-train", "512", "--limit-test", "128", "--threads", "1", "--seed", "3"]

# name -> (arguments after `dtlab run`, how: "run" | "resume" | "mpi")
CASES = {
    "ddp_mlp_local_ring": (["--model", "mlp", "--world-size", "4", "--batch-size", "16", "--epochs", "2"], "run"),
    "ddp_mlp_sync_tree": (["--model", "mlp", "--world-size", "3", "--batch-size", "16", "--epochs", "1", "--bn", "sync",
                           "--allreduce", "tree"], "run"),
    "ddp_cnn_sync_naive": (["--model", "cnn", "--world-size", "2", "--batch-size", "16", "--steps", "10", "--bn", "sync",
                            "--allreduce", "naive"], "run"),
    "ddp_cnn_no_overlap": (["--model", "cnn", "--world-size", "2", "--batch-size", "16", "--steps", "10", "--no-overlap"],
                           "run"),
    "ddp_mlp_no_sync": (["--model", "mlp", "--world-size", "2", "--batch-size", "16", "--steps", "12",
                         "--no-sync-steps", "2"], "run"),
    "ddp_mlp_uneven_last_batch": (["--model", "mlp", "--world-size", "2", "--batch-size", "48", "--epochs", "2",
                                   "--no-broadcast-buffers", "--lr-schedule", "cosine"], "run"),
    "ddp_mlp_join": (["--model", "mlp", "--world-size", "3", "--batch-size", "16", "--epochs", "1", "--uneven-data",
                      "--join"], "run"),
    "ddp_mlp_skip_step": (["--model", "mlp", "--world-size", "2", "--batch-size", "16", "--steps", "8", "--fail-rank",
                           "1", "--fail-step", "3", "--fail-at", "nan", "--on-nonfinite", "skip-step"], "run"),
    "dp_cnn": (["--mode", "dp", "--model", "cnn", "--world-size", "3", "--batch-size", "30", "--steps", "8"], "run"),
    "dp_mlp_droplast": (["--mode", "dp", "--model", "mlp", "--world-size", "4", "--batch-size", "50", "--epochs", "1",
                         "--drop-last"], "run"),
    "localsgd_mlp": (["--mode", "local-sgd", "--model", "mlp", "--world-size", "2", "--batch-size", "16", "--steps", "12",
                      "--average-every", "3", "--warmup-steps", "2"], "run"),
    "localsgd_cnn_sync": (["--mode", "local-sgd", "--model", "cnn", "--world-size", "2", "--batch-size", "16", "--steps",
                           "8", "--average-every", "2", "--bn", "sync"], "run"),
    "async_seeded": (["--mode", "async", "--model", "mlp", "--world-size", "3", "--batch-size", "16", "--steps", "12",
                      "--async-schedule", "seeded", "--async-seed", "5"], "run"),
    "zero_mlp_adam_bucket": (["--mode", "zero", "--model", "mlp", "--world-size", "3", "--batch-size", "16", "--steps",
                              "10", "--optimizer", "adam", "--lr", "0.001", "--parameters-as-bucket-view"], "run"),
    "fsdp_mlp_full_shard_layer_adam": (["--mode", "fsdp", "--model", "mlp", "--world-size", "4", "--batch-size", "16",
                                        "--steps", "10", "--sharding-strategy", "full_shard", "--fsdp-wrap", "layer",
                                        "--optimizer", "adam", "--lr", "0.001", "--no-sync-steps", "1"], "run"),
    "fsdp_cnn_shard_grad_op_eval": (["--mode", "fsdp", "--model", "cnn", "--world-size", "2", "--batch-size", "16",
                                     "--steps", "8", "--sharding-strategy", "shard_grad_op", "--momentum", "0.9",
                                     "--eval-every", "4", "--eval-samples", "64"], "run"),
    "tensor_mlp_tp4_eval": (["--mode", "tensor", "--model", "mlp", "--tp", "4", "--batch-size", "32", "--steps", "10",
                             "--eval-every", "5", "--eval-samples", "64"], "run"),
    "tensor_cnn_tp2_adam": (["--mode", "tensor", "--model", "cnn", "--tp", "2", "--batch-size", "16", "--steps", "8",
                             "--optimizer", "adam", "--lr", "0.001", "--allreduce", "tree"], "run"),
    "one_rank_cnn_threads2": (["--model", "cnn", "--world-size", "1", "--batch-size", "32", "--steps", "6", "--threads",
                               "2"], "run"),
    "eval_every_mlp": (["--model", "mlp", "--world-size", "2", "--batch-size", "16", "--steps", "16", "--eval-every", "4",
                        "--eval-samples", "64"], "run"),
    "resume_ddp_cnn": (["--model", "cnn", "--world-size", "2", "--batch-size", "16", "--steps", "12",
                        "--checkpoint-every", "4", "--momentum", "0.9"], "resume"),
    "resume_dp_mlp": (["--mode", "dp", "--model", "mlp", "--world-size", "2", "--batch-size", "32", "--steps", "10",
                       "--checkpoint-every", "5"], "resume"),
    "resume_fsdp_mlp_full_shard": (["--mode", "fsdp", "--model", "mlp", "--world-size", "2", "--batch-size", "16",
                                    "--steps", "12", "--checkpoint-every", "6", "--optimizer", "adamw", "--lr", "0.001",
                                    "--no-sync-steps", "2"], "resume"),
    "mpi_ddp_mlp_sync": (["--model", "mlp", "--batch-size", "16", "--steps", "10", "--bn", "sync"], "mpi"),
    "pipeline_cnn_gpipe": (["--mode", "pipeline", "--model", "cnn", "--stages", "4", "--microbatches", "4",
                            "--batch-size", "32", "--steps", "6", "--eval-every", "3", "--eval-samples", "64"], "run"),
    "pipeline_cnn_1f1b_deferred": (["--mode", "pipeline", "--model", "cnn", "--stages", "2", "--microbatches", "3",
                                    "--schedule", "1f1b", "--deferred-batch-norm", "--batch-size", "30", "--steps",
                                    "8"], "run"),
    "pipeline_mlp_nobn_adam": (["--mode", "pipeline", "--model", "mlp", "--stages", "3", "--microbatches", "4",
                                "--no-batchnorm", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "32",
                                "--steps", "6"], "run"),
    "mpi_pipeline_mlp_1f1b": (["--mode", "pipeline", "--model", "mlp", "--microbatches", "4", "--schedule", "1f1b",
                               "--batch-size", "32", "--steps", "6"], "mpi"),
    "grid_cnn_pp2_tp2_dp2_deferred": (["--mode", "pipeline", "--model", "cnn", "--pp", "2", "--tp", "2", "--dp", "2",
                                       "--microbatches", "2", "--deferred-batch-norm", "--batch-size", "16", "--steps",
                                       "6", "--eval-every", "3", "--eval-samples", "64"], "run"),
    "tensor_mlp_tp2_dp2": (["--mode", "tensor", "--model", "mlp", "--tp", "2", "--dp", "2", "--batch-size", "16",
                            "--steps", "8"], "run"),
}

DROP_KEYS = {"t", "seconds", "samples_per_s", "train_seconds", "comm_seconds", "hidden_seconds", "hidden_fraction",
             "forward_seconds", "backward_seconds", "optimizer_seconds", "wait_seconds",
             "measured_median", "measured_per_step", "schedule_measured_costs"}  # (the pipeline's bubble by the clock)
DROP_SECTIONS = {"communication", "compute"}


def strip(j, root):
    if isinstance(j, dict):
        return {k: strip(v, root) for k, v in j.items() if k not in DROP_KEYS and k not in DROP_SECTIONS}
    if isinstance(j, list):
        return [strip(v, root) for v in j]
    if isinstance(j, str):
        return j.replace(root, "<DIR>")
    return j


def normalize(run_dir, out_dir, root):
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(run_dir)):
        src = os.path.join(run_dir, name)
        if name.endswith(".safetensors") or name == "bn_stats.bin":
            shutil.copyfile(src, os.path.join(out_dir, name))
        elif name == "metrics.jsonl":
            with open(src) as f, open(os.path.join(out_dir, name), "w") as g:
                for line in f:
                    g.write(json.dumps(strip(json.loads(line), root), sort_keys=True) + "\n")
        elif name == "summary.json":
            with open(src) as f, open(os.path.join(out_dir, name), "w") as g:
                json.dump(strip(json.load(f), root), g, sort_keys=True, indent=1)
        elif name == "config.toml":
            with open(src) as f, open(os.path.join(out_dir, name), "w") as g:
                g.write(f.read().replace(root, "<DIR>"))


def have_mpi(dtlab):
    if not shutil.which("mpirun"):
        return False
    v = subprocess.run([dtlab, "version"], capture_output=True, text=True).stdout
    return "mpi" in v


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"run_matrix: exit {r.returncode}: {' '.join(cmd)} (output in {log})")


def record(args):
    dtlab = os.path.abspath(args.dtlab)
    root = os.path.abspath(args.dir)
    os.makedirs(root, exist_ok=True)
    env_ok = have_mpi(dtlab)
    only = set(args.only.split(",")) if args.only else None
    for name, (flags, how) in CASES.items():
        if only and name not in only:
            continue
        case = os.path.join(root, name)
        if os.path.exists(case):
            shutil.rmtree(case)
        os.makedirs(case)
        out = os.path.join(case, "run")
        log = os.path.join(case, "log.txt")
        if how == "mpi":
            if not env_ok:
                print(f"{name}: skipped (no mpirun or no MPI transport)")
                continue
            run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--timeout", "300", "-np", "2",
                 dtlab, "run", "--comm", "mpi", *flags, *SMALL, "--out", out], log)
        elif how == "resume":
            # the whole run, then the same run stopped at its first checkpoint and resumed: both recorded
            run([dtlab, "run", *flags, *SMALL, "--out", out], log)
            part = os.path.join(case, "resumed")
            run([dtlab, "run", *flags, *SMALL, "--out", part], log + ".part")
            ck = sorted(d for d in os.listdir(os.path.join(part, "checkpoints")) if d.startswith("step-"))
            # keep the oldest checkpoint only, and cut the run's outputs back as a crash there would
            for d in ck[1:]:
                shutil.rmtree(os.path.join(part, "checkpoints", d))
            for f in ("summary.json", "final.safetensors"):
                if os.path.exists(os.path.join(part, f)):
                    os.remove(os.path.join(part, f))
            run([dtlab, "run", "--resume", part], log + ".resume")
            normalize(part, os.path.join(case, "compared-resumed"), root)
        else:
            run([dtlab, "run", *flags, *SMALL, "--out", out], log)
        normalize(out, os.path.join(case, "compared"), root)
        print(f"{name}: recorded")


def compare(args):
    a, b = os.path.abspath(args.a), os.path.abspath(args.b)
    differ = 0
    files = 0
    for name in sorted(os.listdir(a)):
        for sub in ("compared", "compared-resumed"):
            da, db = os.path.join(a, name, sub), os.path.join(b, name, sub)
            if not os.path.isdir(da):
                continue
            if not os.path.isdir(db):
                print(f"{name}/{sub}: missing in {b}")
                differ += 1
                continue
            for f in sorted(set(os.listdir(da)) | set(os.listdir(db))):
                files += 1
                pa, pb = os.path.join(da, f), os.path.join(db, f)
                if not os.path.exists(pa) or not os.path.exists(pb):
                    print(f"{name}/{sub}/{f}: only in {'A' if os.path.exists(pa) else 'B'}")
                    differ += 1
                    continue
                same = open(pa, "rb").read() == open(pb, "rb").read()
                print(f"{name}/{sub}/{f}: {'equal' if same else 'DIFFERS'}")
                differ += not same
    print(f"{files} files compared: " + ("all equal" if differ == 0 else f"{differ} files differ"))
    return 1 if differ else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dir")
    r.add_argument("--dtlab", default="build/dtlab")
    r.add_argument("--only", default="")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    sub.add_parser("list")
    args = p.parse_args()
    if args.cmd == "record":
        record(args)
    elif args.cmd == "compare":
        sys.exit(compare(args))
    else:
        for name, (flags, how) in CASES.items():
            print(f"{name:28} {how:7} dtlab run {' '.join(flags + SMALL)}")


if __name__ == "__main__":
    main()
