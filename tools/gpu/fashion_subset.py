#!/usr/bin/env python3
"""The Fashion-MNIST files a GPU pack carries (tools/gpu/make_pack.sh): the first --train samples of
the training set and the whole test set (10000 samples, 4.4 MB), as valid IDX .gz files whose
headers give the kept counts, so that dtlab reads them exactly as it reads the full files.

    fashion_subset.py SRC_DIR DST_DIR [--train N] [--test N]

Deterministic (gzip without a timestamp): the same inputs give the same bytes, so a pack built
twice from one commit is identical. Exit 1 naming the file when a source file is missing or is not
an IDX file of the kind its name says.
"""
import argparse
import gzip
import os
import struct
import sys

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions: count, rows, cols
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension: count
PIXELS = 28 * 28


def read_idx(path, magic):
    if not os.path.isfile(path):
        sys.exit(f"fashion_subset: {path} does not exist (the Fashion-MNIST files: apt-get install "
                 "dataset-fashion-mnist, or give the folder that holds them)")
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        sys.exit(f"fashion_subset: {path}: magic 0x{got:08x}, expected 0x{magic:08x}")
    return data


def write_subset(src, dst, name, keep):
    """(kept, total) samples of one split, written as DST/<name>-{images-idx3,labels-idx1}-ubyte.gz."""
    images = read_idx(os.path.join(src, f"{name}-images-idx3-ubyte.gz"), IMAGES_MAGIC)
    labels = read_idx(os.path.join(src, f"{name}-labels-idx1-ubyte.gz"), LABELS_MAGIC)
    total, rows, cols = struct.unpack(">III", images[4:16])
    if (rows, cols) != (28, 28) or struct.unpack(">I", labels[4:8])[0] != total:
        sys.exit(f"fashion_subset: {src}/{name}-*: {total} images of {rows}x{cols}, "
                 f"{struct.unpack('>I', labels[4:8])[0]} labels: not Fashion-MNIST")
    n = total if keep <= 0 else min(keep, total)
    out_images = struct.pack(">IIII", IMAGES_MAGIC, n, 28, 28) + images[16:16 + n * PIXELS]
    out_labels = struct.pack(">II", LABELS_MAGIC, n) + labels[8:8 + n]
    for suffix, payload in (("images-idx3-ubyte.gz", out_images), ("labels-idx1-ubyte.gz", out_labels)):
        with open(os.path.join(dst, f"{name}-{suffix}"), "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as z:
                z.write(payload)
    return n, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--train", type=int, default=8192, help="training samples kept (0: all)")
    ap.add_argument("--test", type=int, default=0, help="test samples kept (0: all)")
    a = ap.parse_args()
    os.makedirs(a.dst, exist_ok=True)
    train = write_subset(a.src, a.dst, "train", a.train)
    test = write_subset(a.src, a.dst, "t10k", a.test)
    print(f"fashion_subset: train {train[0]} of {train[1]}, test {test[0]} of {test[1]} -> {a.dst}")


if __name__ == "__main__":
    main()
