#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses: fuzz/corpus/<target>/<seed>.

    python3 fuzz/make_corpus.py [--dtlab build/dtlab]

The committed corpus is this script's output; run it again after a format changes. The seeds are
small valid inputs (made by a real `dtlab run`, taken from the lessons, or written by hand) and a
few malformed ones, each named for what it is. With --dtlab, config and run_dir seeds come from a
real run (`dtlab run --model mlp --world-size 2 --steps 2 --eval-every 1` on 32 samples, arrays
trimmed to 3 values, paths replaced); without it, the run's files as committed are kept. Inputs
that libFuzzer finds are not added here: a finding becomes a regression test instead.
Python 3.11 standard library only.
"""
import argparse
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def fresh(target):
    shutil.rmtree(os.path.join(CORPUS, target), ignore_errors=True)


# ---- dataset: byte 0 = mode (file | 4: harness gzips | 8: check all), byte 1 = limit, payload ----

def idx_images(count, rows=28, cols=28, payload=None, magic=0x803):
    pixels = bytes((7 * i + 3) % 256 for i in range((count if payload is None else payload) * rows * cols))
    return struct.pack(">IIII", magic, count, rows, cols) + pixels


def idx_labels(labels, magic=0x801, count=None):
    return struct.pack(">II", magic, len(labels) if count is None else count) + bytes(labels)


def gz(b):
    return gzip.compress(b, compresslevel=9, mtime=0)


def dataset():
    fresh("dataset")
    raw, zipped, check = 0, 4, 8
    # valid files, in the two layers
    put("dataset", "train-images-idx", bytes([0 | zipped, 0]) + idx_images(2))
    put("dataset", "train-images-gz", bytes([0 | raw, 1]) + gz(idx_images(2)))
    put("dataset", "train-labels-idx", bytes([1 | zipped | check, 0]) + idx_labels([3, 7]))
    put("dataset", "t10k-images-gz-check", bytes([2 | raw | check, 0]) + gz(idx_images(1)))
    put("dataset", "t10k-labels-gz", bytes([3 | raw, 0]) + gz(idx_labels([9])))
    put("dataset", "two-gzip-members", bytes([3 | raw, 0]) + gz(idx_labels([9])[:5]) + gz(idx_labels([9])[5:]))
    # malformed
    put("dataset", "bad-magic", bytes([1 | zipped, 0]) + idx_labels([3, 7], magic=0x803))
    put("dataset", "label-out-of-range", bytes([1 | zipped, 0]) + idx_labels([3, 10]))
    put("dataset", "count-mismatch", bytes([1 | zipped, 0]) + idx_labels([3, 7, 1]))
    put("dataset", "short-payload", bytes([0 | zipped, 0]) + idx_images(2, payload=1))
    put("dataset", "wrong-dimensions", bytes([2 | zipped, 0]) + idx_images(1, rows=27))
    put("dataset", "truncated-gzip", bytes([3 | raw, 0]) + gz(idx_labels([9]))[:-6])
    put("dataset", "trailing-garbage", bytes([3 | raw, 0]) + gz(idx_labels([9])) + b"junk")
    put("dataset", "not-gzip", bytes([2 | raw, 0]) + idx_images(1)[:64])


# ---- safetensors ----

def safetensors(tensors, metadata=None, header=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)] in order, as dtlab writes them."""
    if header is None:
        h = {}
        if metadata:
            h["__metadata__"] = metadata
        off = 0
        for name, dtype, shape, data in tensors:
            h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
        header = json.dumps(h, separators=(",", ":"))
    while pad and (8 + len(header)) % 8:
        header += " "
    return struct.pack("<Q", len(header)) + header.encode() + b"".join(t[3] for t in tensors)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def safetensors_seeds():
    fresh("safetensors")
    model = [("1.weight", "F32", [2, 3], f32(0.5, -1, 2, 0, 0.25, 3)), ("1.bias", "F32", [2], f32(0.1, -0.1)),
             ("2.running_mean", "F32", [2], f32(0, 0)), ("2.num_batches_tracked", "I64", [], struct.pack("<q", 7))]
    put("safetensors", "model", safetensors(model, {"format": "pt", "dtlab_version": "0.1.0"}))
    put("safetensors", "no-metadata", safetensors(model[:2]))
    put("safetensors", "empty-header", safetensors([], header="{}"))
    put("safetensors", "f64-and-unknown-dtype",
        safetensors([("x", "F64", [1], struct.pack("<d", 1.5)), ("y", "BF16", [2], b"\0\0\0\0")]))
    put("safetensors", "truncated", safetensors(model)[:-9])
    put("safetensors", "header-length-too-big", struct.pack("<Q", 1 << 40) + b"{}")
    put("safetensors", "not-json", safetensors([], header="{\"a\":"))
    put("safetensors", "offsets-outside",
        safetensors([], header='{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'))
    put("safetensors", "shape-disagrees",
        safetensors([("w", "F32", [3], f32(1, 2))]))
    put("safetensors", "header-not-object", safetensors([], header="[1,2]"))
    put("safetensors", "big-numbers",
        safetensors([], header='{"w":{"dtype":"F32","shape":[65536,65536,-1,2.5],"data_offsets":[0,18446744073709551615]}}'))


# ---- config.toml and run directories (a real run) ----

RUN_ARGS = ["run", "--model", "mlp", "--world-size", "2", "--batch-size", "8", "--limit-train", "32",
            "--limit-test", "16", "--steps", "2", "--trace-steps", "1", "--eval-every", "1", "--eval-samples", "16",
            "--threads", "1"]


def trim(o):
    """Arrays of numbers cut to 3 values (BatchNorm statistics, probe outputs)."""
    if isinstance(o, list) and len(o) > 3 and all(isinstance(x, (int, float)) or x is None for x in o):
        return o[:3]
    if isinstance(o, list):
        return [trim(x) for x in o]
    if isinstance(o, dict):
        return {k: trim(v) for k, v in o.items()}
    return o


def clean_config(text):
    out = []
    for line in text.splitlines():
        if line.startswith("data_dir ="):
            line = 'data_dir = "fuzz-no-dataset"'  # the reader's probe-image load then fails at once
        elif line.startswith("out_dir ="):
            line = 'out_dir = "runs/seed"'
        elif line.startswith("sgemm ="):
            line = 'sgemm = "reference"'
        out.append(line)
    return "\n".join(out) + "\n"


def real_run(dtlab):
    tmp = tempfile.mkdtemp(prefix="dtlab-corpus-")
    try:
        run = os.path.join(tmp, "run")
        subprocess.run([dtlab] + RUN_ARGS + ["--out", run], check=True, stdout=subprocess.DEVNULL)
        files = {}
        with open(os.path.join(run, "config.toml")) as f:
            files["config.toml"] = clean_config(f.read())
        with open(os.path.join(run, "metrics.jsonl")) as f:
            files["metrics.jsonl"] = "".join(json.dumps(trim(json.loads(l)), separators=(",", ":")) + "\n"
                                             for l in f if l.strip())
        with open(os.path.join(run, "summary.json")) as f:
            files["summary.json"] = json.dumps(trim(json.load(f)), separators=(",", ":")) + "\n"
        with open(os.path.join(run, "trace.json")) as f:
            t = json.load(f)
        kept, seen = [], {}
        for e in t["traceEvents"]:
            key = (e.get("cat"), e.get("ph"), e.get("pid"))
            if seen.get(key, 0) < 2:
                kept.append(e)
                seen[key] = seen.get(key, 0) + 1
        t["traceEvents"] = kept
        files["trace.json"] = json.dumps(t, separators=(",", ":")) + "\n"
        return files
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def committed_run():
    d = os.path.join(CORPUS, "run_dir")
    files = {}
    for sel, name in enumerate(["metrics.jsonl", "summary.json", "trace.json", "config.toml"]):
        with open(os.path.join(d, name), "rb") as f:
            files[name] = f.read()[1:].decode()
    return files


def config_seeds(run):
    fresh("config")
    cfg = run["config.toml"]
    put("config", "real-run.toml", cfg)
    put("config", "dp.toml", cfg.replace('mode = "ddp"', 'mode = "dp"').replace("world_size = 2", "world_size = 4"))
    put("config", "local-sgd.toml", cfg.replace('mode = "ddp"', 'mode = "local-sgd"')
        .replace("average_every = 4", "average_every = 8").replace('bn = "local"', 'bn = "sync"'))
    put("config", "bn-momentum-none.toml", cfg.replace("bn_momentum = 0.10000000000000001", 'bn_momentum = "none"'))
    put("config", "minimal.toml", '[model]\nmodel = "cnn"\n\n[distributed]\nworld_size = 4\n')
    put("config", "unknown-key.toml", cfg.replace("[model]\n", "[model]\nlayers = 3\n"))
    put("config", "wrong-type.toml", cfg.replace("world_size = 2", 'world_size = "two"'))
    put("config", "invalid-value.toml", "[data]\nbatch_size = 0\n")
    put("config", "broken-toml.toml", "[model\nmodel = mlp\n")


def run_dir_seeds(run):
    fresh("run_dir")
    for sel, name in enumerate(["metrics.jsonl", "summary.json", "trace.json", "config.toml"]):
        put("run_dir", name, bytes([sel]) + run[name].encode())
    put("run_dir", "metrics-interrupted-run", bytes([0x80]) + run["metrics.jsonl"].encode())
    put("run_dir", "metrics-not-json", bytes([0]) + b'{"kind":"step","rank":0,\n')
    put("run_dir", "summary-not-json", bytes([1]) + b"{\"steps\": 2,")
    put("run_dir", "trace-old-collective-names",
        bytes([2]) + json.dumps({"traceEvents": [
            {"ph": "X", "pid": 1, "cat": "collective", "name": "allreduce grad bucket 3", "ts": 5, "dur": 2,
             "args": {"bytes": 64, "step": 0}}]}).encode())
    put("run_dir", "metrics-big-numbers",
        bytes([0]) + b'{"kind":"step","rank":1,"step":0,"bytes_sent":18446744073709551615,"correct":-2.5e30,'
        b'"bn":[{"layer":"2","count":9223372036854775807,"batch_mean":[1e308,-0.0]}]}\n')
    put("run_dir", "config-world-4", bytes([3]) + run["config.toml"].replace("world_size = 2", "world_size = 4").encode())


# ---- bn_stats.bin and checkpoints (a real run with BatchNorm statistics and checkpoints) ----

CKPT_ARGS = ["run", "--model", "cnn", "--world-size", "2", "--batch-size", "4", "--limit-train", "16",
             "--limit-test", "8", "--steps", "3", "--momentum", "0.9", "--record-bn", "all",
             "--checkpoint-every", "2", "--threads", "1"]
CKPT_FILES = ["state.json", "rank0.json", "rank0.safetensors", "rank0.records", "COMMITTED"]


def binary_run_seeds(dtlab):
    """With --dtlab: bn_stats/ and checkpoint/ seeds from a real run (else the committed ones stay)."""
    tmp = tempfile.mkdtemp(prefix="dtlab-corpus-")
    try:
        run = os.path.join(tmp, "run")
        subprocess.run([dtlab] + CKPT_ARGS + ["--out", run], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(run, "bn_stats.bin"), "rb") as f:
            bn = f.read()
        fresh("bn_stats")
        put("bn_stats", "cnn-2-ranks-3-steps", bn)
        put("bn_stats", "header-start-only", bn[:20])
        put("bn_stats", "truncated-record", bn[:len(bn) - 7])
        put("bn_stats", "bad-magic", b"DTLABBN9" + bn[8:])
        ckpt = os.path.join(run, "checkpoints", "step-00000002")
        fresh("checkpoint")
        for sel, name in enumerate(CKPT_FILES):
            path = os.path.join(ckpt, name)
            if name.endswith(".safetensors"):  # the real one is megabytes: a small one with its names
                put("checkpoint", "rank0-safetensors", bytes([sel]) + safetensors(
                    [("0.weight", "F32", [2, 2], f32(1, 2, 3, 4)), ("1.running_mean", "F32", [2], f32(0, 0)),
                     ("1.num_batches_tracked", "I64", [], struct.pack("<q", 3)),
                     ("optim.momentum.0.weight", "F32", [2, 2], f32(0.5, 0.5, 0.5, 0.5))],
                    {"format": "pt", "dtlab_version": "0.1.0"}))
            elif os.path.exists(path):
                with open(path, "rb") as f:
                    put("checkpoint", name.replace(".", "-"), bytes([sel]) + f.read())
        put("checkpoint", "state-format-version-2", bytes([0]) + b'{"format":"dtlab-checkpoint","format_version":2}')
        put("checkpoint", "state-files-wrong-types",
            bytes([0]) + b'{"format":"dtlab-checkpoint","format_version":1,"files":{"rank0.json":{"bytes":"x"}}}')
        put("checkpoint", "damaged-rank-file", bytes([0x81]) + b'{"rank":0}')
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- lessons and the expression language ----

def lesson_seeds():
    fresh("lesson")
    for src in ["examples/sampler-shards.toml", "bn-ddp.toml"]:
        with open(os.path.join(ROOT, "lessons", src), "rb") as f:
            put("lesson", os.path.basename(src), f.read())
    put("lesson", "minimal.toml", '''format_version = 1
id = "fuzz"
version = 1
title = "Smallest lesson"
minutes = 1
budget_s = 5

[question]
text = "How many steps?"

[[predict]]
id = "steps"
kind = "numeric"
prompt = "Steps?"
answer = "steps"
atol = 0.5

[runs.one]
args = "--model mlp --limit-train 64 --limit-test 16 --steps 2"

[quantities]
steps = { run = "one", summary = "/steps" }
loss = { run = "one", metrics = "loss", reduce = "mean" }

[[check]]
id = "two"
that = "steps == 2 and loss > 0"
why = "it ran"

[[hint]]
text = "Count them."

[explain]
text = "{steps:d} steps, loss {loss:.3f}."
''')
    put("lesson", "bad-toml.toml", 'id = "x"\n[question\ntext = 1\n')
    put("lesson", "bad-expression.toml", 'id = "fuzz"\n[[check]]\nid = "c"\nthat = "approx(a, b, rtol=)"\nwhy = "?"\n')
    put("lesson", "unknown-flag.toml", 'id = "fuzz"\n[runs.one]\nargs = "--model resnet --world-size 0"\n')


def expr_seeds():
    fresh("expr")
    seeds = {
        "arithmetic": "1 + 2 * -a / (b - 0.5) >= 1e-5",
        "logic": "not f and (a > 1 or yes) and s != \"x\"",
        "approx": "approx(t, u, rtol=1e-5, atol=1e-8) or max_abs_diff(t, u) < 0.6",
        "tensors": "mean(t * 2 + u) - std(w) / norm(n) + spread(t) + sum(e)",
        "reductions-of-empty": "min(e)",
        "functions": "abs(b) + sqrt(a) + log(a) + log2(a) + exp(zero) + floor(a) + ceil(a) + round(a)",
        "at-first-last": "at(w, -1) + first(t) + last(u) + len(w) + at(t, 7)",
        "min-max-many": "min(a, b, 3) + max(a, b, 3, inf) + max(t)",
        "if": "if(a > b, rel_diff(t, u), nan)",
        "contains": "contains(s, \"value per channel\") and bitwise_equal(t, t)",
        "names-with-dots": "run.ratio * 4 == 3",
        "string-escapes": "'it\\'s' == \"it's\\n\"",
        "from-a-lesson": "approx(local_used_r1, own_r1, rtol=0, atol=1e-6) and not approx(local_used_r1, global_used, rtol=0, atol=1e-4)",
        "placeholders": "With {a:.3g} and {{braces}}, {mean(t):,.0f} and {a / big:.1%} {s} {t:.2e} {if(f, 1, 2):d}",
        "errors-chain": "a < b < 3",
        "errors-power": "a ** 2",
        "errors-unknown-function": "aprox(a, b)",
        "errors-nesting": "(" * 40 + "a" + ")" * 40,
    }
    for name, text in seeds.items():
        put("expr", name, text)


# ---- the layout file ----

def layout_seeds():
    fresh("layout")
    put("layout", "layout.ini", """[Window][Debug##Default]
Pos=60,60
Size=400,400
Collapsed=0

[Window][Controls]
Pos=0,19
Size=320,981
Collapsed=0
DockId=0x00000001,0

[Window][Allreduce]
Pos=322,19
Size=958,640
Collapsed=0
DockId=0x00000003,0

[Docking][Data]
DockSpace     ID=0x8B93E3BD Window=0xA787BDB4 Pos=0,19 Size=1280,981 Split=X
  DockNode    ID=0x00000001 Parent=0x8B93E3BD SizeRef=320,981 Selected=0x9C6E4A6B
  DockNode    ID=0x00000002 Parent=0x8B93E3BD SizeRef=958,981 Split=Y
    DockNode  ID=0x00000003 Parent=0x00000002 SizeRef=958,640 CentralNode=1
""")
    put("layout", "crlf.ini", "[Window][Log]\r\nPos=0,700\r\nSize=1280,300\r\n")
    put("layout", "binary.ini", b"[Window][X]\nPos=\x00\x01\x02\n")
    put("layout", "no-header.ini", "Pos=1,2\n[Window][X]\n")
    put("layout", "bad-header.ini", "[Window]Name\nPos=1,2\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtlab", help="the dtlab executable, for a real run (else the committed run files are kept)")
    args = ap.parse_args()
    run = real_run(args.dtlab) if args.dtlab else committed_run()
    dataset()
    safetensors_seeds()
    config_seeds(run)
    run_dir_seeds(run)
    lesson_seeds()
    expr_seeds()
    layout_seeds()
    if args.dtlab:
        binary_run_seeds(args.dtlab)
    total = files = 0
    for d, _, names in os.walk(CORPUS):
        for n in names:
            files += 1
            total += os.path.getsize(os.path.join(d, n))
    print(f"fuzz/corpus: {files} files, {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
