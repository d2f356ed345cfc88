#!/usr/bin/env python3
"""Reads a run directory's bn_stats.bin (lab/run/bn_stats.h) into numpy arrays.

    from read_bn_stats import read_bn_stats
    world, layers, steps = read_bn_stats("runs/quickstart/bn_stats.bin")
    step, epoch, stats = steps[0]              # stats[layer][field] -> (world, channels) array
    stats["2"]["batch_mean"][1]                # rank 1's batch mean of module 2, per channel

Fields: batch_mean, batch_var (used to normalize), local_mean, local_var (the rank's own batch; None
when the run had no SyncBN: then they are batch_*), running_mean, running_var; also "count" and
"num_batches_tracked" per rank. NaN rows: a rank without statistics that step (an idle device).

    python3 tools/read_bn_stats.py RUN_DIR/bn_stats.bin     # prints a summary
"""
import struct
import sys

import numpy as np

FIELDS = ["batch_mean", "batch_var", "local_mean", "local_var", "running_mean", "running_var"]


def read_bn_stats(path):
    b = open(path, "rb").read()
    if b[:8] != b"DTLABBN1":
        raise ValueError(f"{path}: not a dtlab BatchNorm statistics file")
    version, world, nlayers = struct.unpack_from("<III", b, 8)
    pos = 20
    layers = []
    for _ in range(nlayers):
        (n,) = struct.unpack_from("<I", b, pos)
        name = b[pos + 4:pos + 4 + n].decode()
        (channels,) = struct.unpack_from("<I", b, pos + 4 + n)
        layers.append((name, channels))
        pos += 8 + n
    steps = []
    while pos < len(b):
        step, epoch, n = struct.unpack_from("<qqI", b, pos)
        pos += 20
        stats = {}
        for name, c in layers:
            s = {"count": np.frombuffer(b, "<i8", world, pos), "num_batches_tracked": np.frombuffer(b, "<i8", world, pos + 8 * world)}
            pos += 16 * world
            for field in FIELDS:
                how = b[pos]
                pos += 1
                if how == 0:
                    s[field] = None
                elif how == 1:  # the same on every rank, stored once
                    s[field] = np.tile(np.frombuffer(b, "<f4", c, pos), (world, 1))
                    pos += 4 * c
                else:
                    s[field] = np.frombuffer(b, "<f4", world * c, pos).reshape(world, c)
                    pos += 4 * world * c
            stats[name] = s
        steps.append((step, epoch, stats))
    return world, layers, steps


if __name__ == "__main__":
    world, layers, steps = read_bn_stats(sys.argv[1])
    print(f"{world} ranks, layers {layers}, {len(steps)} recorded steps: {[s[0] for s in steps[:10]]}...")
    step, epoch, stats = steps[-1]
    name = layers[0][0]
    print(f"step {step} (epoch {epoch}), layer {name}, batch_mean of channel 0 per rank:", stats[name]["batch_mean"][:, 0])
