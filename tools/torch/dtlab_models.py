"""dtlab's two models in PyTorch: the one definition every tool of this repository uses (the
fixture generators, the parity harness, the weights round trip, the autocast and accuracy
references, the CPU and GPU training peers).

dtlab builds the same modules in the same order (lab/nn/model.cpp), so after
torch.manual_seed(s) each module draws its initial weights from the generator exactly as dtlab's
`--seed s` does: the initial weights are equal bit for bit. Changing anything here (a layer, its
order, bias=False, a size) changes the weights dtlab must reproduce and every committed fixture in
tests/fixtures/: regenerate them (tools/fixtures/gen_*.py, tools/parity/parity.py
--write-fixtures) and change lab/nn/model.cpp with it.

The state_dict keys are nn.Sequential's, the module's index then the tensor ("1.weight",
"2.running_mean", "2.num_batches_tracked"): the names in dtlab's safetensors files.

batchnorm=False is dtlab's `--no-batchnorm`: the same model with its BatchNorm layers left out
and nothing else changed (the cnn's convolutions keep bias=False). BatchNorm draws nothing from the
generator, so the other layers' initial weights are the same; the modules after a left-out
BatchNorm move up one index ("4.weight" becomes "3.weight"), as in dtlab.
"""
from torch import nn


def _sequential(*layers):
    return nn.Sequential(*(m for m in layers if m is not None))


def mlp(batchnorm=True):
    """(B, 1, 28, 28) -> (B, 10); 235,914 parameters (1.weight is (256, 784))."""
    bn = nn.BatchNorm1d if batchnorm else (lambda n: None)
    return _sequential(
        nn.Flatten(),                                              # 0: (B, 784)
        nn.Linear(784, 256), bn(256), nn.ReLU(),                   # 1, 2, 3: (B, 256)
        nn.Linear(256, 128), bn(128), nn.ReLU(),                   # 4, 5, 6: (B, 128)
        nn.Linear(128, 10))                                        # 7: (B, 10) logits


def cnn(batchnorm=True):
    """(B, 1, 28, 28) -> (B, 10). The convolutions have no bias: BatchNorm's shift replaces it."""
    bn = nn.BatchNorm2d if batchnorm else (lambda n: None)
    return _sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), bn(32), nn.ReLU(),               # 0-2: (B, 32, 28, 28)
        nn.MaxPool2d(2),                                                             # 3: (B, 32, 14, 14)
        nn.Conv2d(32, 64, 3, padding=1, bias=False), bn(64), nn.ReLU(),              # 4-6: (B, 64, 14, 14)
        nn.MaxPool2d(2),                                                             # 7: (B, 64, 7, 7)
        nn.Flatten(),                                                                # 8: (B, 3136)
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(),                                       # 9, 10: (B, 128)
        nn.Linear(128, 10))                                                          # 11: (B, 10) logits


MODELS = {"mlp": mlp, "cnn": cnn}

