"""Read and write dtlab's safetensors files from PyTorch (Debian 12 ships no safetensors package).

The format: u64 little-endian header length N, N bytes of JSON header mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end)} (offsets into the byte buffer that follows) plus an
optional "__metadata__" map of strings. dtlab names tensors with PyTorch's state_dict keys, so:

    from dtlab_safetensors import load_file, save_file
    model.load_state_dict(load_file("runs/x/final.safetensors"))    # dtlab -> PyTorch
    save_file(model.state_dict(), "from_torch.safetensors")         # PyTorch -> dtlab --init

Command line:
    dtlab_safetensors.py show FILE                     list tensors
    dtlab_safetensors.py export --model cnn --seed S OUT   a fresh model's state (dtlab_models.py)
"""
import argparse
import json
import struct
from collections import OrderedDict

import torch

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
           "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_file(path, with_metadata=False):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: truncated safetensors file (header of {n} bytes)")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = OrderedDict()
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = entry["data_offsets"]
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
        buf = bytearray(raw[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(entry["shape"]).clone()
    return (out, meta) if with_metadata else out


def save_file(state, path, metadata=None):
    header = OrderedDict()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks, offset = [], 0
    for name, t in state.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} is not supported")
        data = t.numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)  # keep the byte buffer 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode("utf-8"))
        for c in chunks:
            f.write(c)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show")
    s.add_argument("file")
    e = sub.add_parser("export")
    e.add_argument("--model", choices=["mlp", "cnn"], required=True)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("out")
    a = p.parse_args()
    if a.cmd == "show":
        state, meta = load_file(a.file, with_metadata=True)
        for k, v in meta.items():
            print(f"# {k} = {v}")
        for k, v in state.items():
            print(f"{k:24s} {str(v.dtype):14s} {list(v.shape)}")
    else:
        from dtlab_models import MODELS  # beside this file: a script's directory is on sys.path
        torch.manual_seed(a.seed)
        model = MODELS[a.model]()
        save_file(model.state_dict(), a.out, {"format": "pt", "producer": f"torch {torch.__version__}"})


if __name__ == "__main__":
    main()
