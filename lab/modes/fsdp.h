// FullyShardedDataParallel's flat parameters and gradient reduction (ZeRO stages 2 and 3), as
// PyTorch's FSDP defines them (../docs: lab/modes/README.md; PyTorch 1.13's
// torch/distributed/fsdp/fully_sharded_data_parallel.py and flat_param.py):
//
//   unit          a wrapped module: the whole model (--fsdp-wrap model), or every module that has
//                 parameters (--fsdp-wrap layer: each Linear, Conv2d, BatchNorm its own unit)
//   flat param    torch.cat of the unit's parameters, flattened, in module order: N elements
//   shard         rank r's: flat.chunk(W)[r] zero-padded at the end to S = ceil(N / W) elements,
//                 i.e. the flat parameter padded at the end to W S and cut into W equal blocks
//   gradient      the unit's flat gradient, padded, divided by the pre-divide factor f, reduce-
//                 scattered (rank r gets block r, summed), divided by the post-divide factor W / f;
//                 f doubles from 1 while W % f == 0 and W / f > f (f = 2 for W = 2, 3, 4; 4 for 8)
//
// DDP multiplies each gradient by 1/W while copying it into its bucket. Dividing by powers of two
// is exact, so the scaling is the same bits for W = 2, 4, 8; W = 3 divides by 2, then by 1.5.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lab {

struct FsdpUnit {
  std::string name;          // "" (the whole model) or the module's name ("1", "4", ...)
  std::vector<int> params;   // indices into Model::params(), in module order
  int64_t numel = 0;         // N
  int64_t shard = 0;         // S = ceil(N / W)
  int64_t padding(int world) const { return shard * world - numel; }
};

// The units of a model whose parameters have these names and element counts (Model::params()
// order); wrap: "model" or "layer" (a parameter "4.weight" belongs to module "4").
std::vector<FsdpUnit> fsdp_units(const std::vector<std::string>& names, const std::vector<int64_t>& numels,
                                 const std::string& wrap, int world);

// FSDP's _get_gradient_predivide_factor(world_size).
int fsdp_predivide_factor(int world);

}  // namespace lab
