// The GPU's ModelExecutor (lab/nn/executor.h): runs a lab::Model's forward and backward on one GPU
// with the backend's ops, host-staged. The host modules keep the state of record (parameters,
// gradients, running statistics); every forward uploads the parameters, every backward adds the
// device's gradients to the host ones. Plain C++: front ends include this without CUDA headers.
//
// Supports the modules of the lab's models: Flatten, Linear, Conv2d (stride 1, zero padding),
// BatchNorm1d / BatchNorm2d (local or SyncBN: the host BatchNorm does the collectives), ReLU and
// MaxPool2d(2). Does not: any other module or pooling size (ConfigError), autocast (the CPU's
// emulation; Model::set_executor refuses it).
#pragma once

#include <memory>

#include "executor.h"

namespace lab {
class Model;
}

namespace lab::cuda {

// The executor of `model` for rank `rank` on opt.device ("cuda" or "cuda:N"). Every rank of a
// process runs on that one GPU, each with its own context (stream, cuBLAS and cuDNN handles).
// Create it on any thread and use it from one thread at a time (forward and backward make the
// device current on the calling thread). Throws ConfigError for a malformed device or a module the
// GPU cannot run, DeviceError when the GPU cannot be used (no driver, no GPU, no such index).
std::unique_ptr<lab::ModelExecutor> make_cuda_executor(lab::Model& model, const lab::ComputeOptions& opt, int rank);

}  // namespace lab::cuda
