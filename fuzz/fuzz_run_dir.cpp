// Fuzzes the run-directory reader (viz/data/run_data.h: load_run_dir), what `dtlab gui --open`
// and the lessons read: config.toml, metrics.jsonl, summary.json and trace.json. One file is
// fuzzed at a time, the other three are valid (a trimmed `dtlab run --model mlp --world-size 2
// --steps 2 --eval-every 1` run directory, the same run as the seed corpus).
//
// Input: byte 0 % 4 picks the file (0 metrics.jsonl, 1 summary.json, 2 trace.json, 3 config.toml),
// the rest is its content. Byte 0 >= 128 leaves summary.json and trace.json out (an interrupted
// run), when neither is the fuzzed file.
// Expected errors: lab::IoError, lab::ConfigError (any lab::Error). Anything else is a finding.
#include <cstdint>
#include <cstdio>
#include <string>

#include "errors.h"
#include "fuzz_util.h"
#include "run_data.h"

namespace {

// data_dir names no directory: the reader's attempt to load the probe image fails at once.
const char* const kConfig = R"(# dtlab run configuration (resolved). Read back by `dtlab gui --open` and lessons.
format_version = 1
dtlab_version = "0.1.0"

[backends]
sgemm = "reference"
transport = "threads"
allreduce = "ring"

[model]
model = "mlp"
bn = "local"
bn_momentum = 0.10000000000000001
bn_eps = 1.0000000000000001e-05
track_running_stats = true

[data]
data_dir = "fuzz-no-dataset"
limit_train = 32
limit_test = 16
batch_size = 8
shuffle = true
drop_last = false
sampler_drop_last = false
eval_batch_size = 1000

[distributed]
world_size = 2
comm = "threads"
broadcast_buffers = true
bucket_cap_mb = 25.0
timeout_s = 60.0
allreduce = "ring"
mode = "ddp"
average_every = 4
warmup_steps = 0
overlap = true
no_sync_steps = 0
link_latency_us = 0.0
link_gbps = 0.0
uneven_data = false
join = false

[optim]
lr = 0.050000000000000003
momentum = 0.90000000000000002
weight_decay = 0.0
nesterov = false
lr_schedule = "constant"
lr_t_max = 0
lr_min = 0.0
lr_step_size = 1
lr_gamma = 0.10000000000000001

[schedule]
epochs = 1
steps = 2
seed = 0
threads = 1

[output]
out_dir = "runs/seed"
init = ""
trace_steps = 1
eval_every = 1
eval_samples = 16

[failure_injection]
fail_rank = -1
fail_step = -1
fail_at = "backward"
)";

const char* const kMetrics =
    R"({"kind":"step","rank":0,"step":0,"epoch":0,"batch":0,"batch_size":8,"loss":2.5533884,"correct":0,"accuracy":0,"bytes_sent":1893488,"t":0.019522232,"bn":[{"layer":"2","count":8,"batch_mean":[0.20734625,0.5486873,0.08700848],"batch_var":[0.14727405,0.14385934,0.14495945],"running_mean":[0.020734625,0.054868728,0.008700849],"running_var":[0.9168313,0.916441,0.9165668],"num_batches_tracked":1}]}
{"kind":"step","rank":1,"step":0,"epoch":0,"batch":0,"batch_size":8,"loss":2.3583336,"correct":0,"accuracy":0,"bytes_sent":943656,"t":0.015484332,"bn":[{"layer":"2","count":8,"batch_mean":[0.077637404,0.55621123,0.10604443],"batch_var":[0.23265055,0.10620672,0.035046607],"running_mean":[0.0077637406,0.055621125,0.010604443],"running_var":[0.9265886,0.91213787,0.9040053],"num_batches_tracked":1}]}
{"kind":"step","rank":0,"step":1,"epoch":0,"batch":1,"batch_size":8,"loss":2.1392555,"correct":2,"accuracy":0.25,"bytes_sent":2840232,"t":0.027344753,"bn":[{"layer":"2","count":8,"batch_mean":[0.1293363,0.7534446,0.12267306],"batch_var":[0.14177871,0.62591714,0.11009881],"local_mean":[0.1293363,0.7534446,0.12267306],"local_var":[0.14177871,0.62591714,0.11009881],"running_mean":[0.03159479,0.12472632,0.020098068],"running_var":[0.84135145,0.8963303,0.8374928],"num_batches_tracked":2}]}
{"kind":"step","rank":1,"step":1,"epoch":0,"batch":1,"batch_size":8,"loss":null,"correct":1,"accuracy":0.125,"bytes_sent":1887312,"t":0.027889605}
{"epoch":0,"kind":"epoch","lr":0.05,"samples_per_s":1236.5291738964982,"seconds":0.025878888,"steps":2,"test_accuracy":0.25,"test_loss":2.1223840713500977,"train_accuracy":0.09375,"train_loss":2.3035197257995605}
{"epoch":0,"eval_mode":{"accuracy":0.125,"loss":2.302239418029785},"kind":"eval","probe":{"eval_mode":[0.09971709549427032,0.08797449618577957,0.09793654084205627],"label":9,"test_index":0,"train_mode":[0.07833582162857056,0.06177813187241554,0.058341894298791885]},"samples":16,"steps":1,"train_mode":{"accuracy":0.25,"loss":2.1717904806137085}}
)";

const char* const kSummary =
    R"({"epochs":1,"format_version":1,"mode":"ddp","producer":"dtlab 0.1.0","samples":32,"samples_per_s":320.3113875122562,"steps":2,"steps_per_epoch":2,"test_eval_mode":{"accuracy":0.25,"loss":2.1223843097686768,"samples":16},"test_samples":16,"test_train_mode":{"accuracy":0.1875,"batch_size":8,"loss":1.8297855257987976,"samples":16},"train_samples":32,"train_seconds":0.099902786}
)";

const char* const kTrace =
    R"({"displayTimeUnit":"ms","otherData":{"format_version":1,"model":"mlp","producer":"dtlab 0.1.0","test_samples":16,"trace_steps":1,"train_samples":32,"world_size":2},"traceEvents":[
{"args":{"name":"rank 0"},"name":"process_name","ph":"M","pid":0},
{"args":{"bytes":943656,"chunk":0,"dst":1,"op":"broadcast","op_seq":0,"phase":"broadcast","ring_step":0,"src":0,"step":-1,"tag":-1,"what":"parameters"},"cat":"chunk","dur":360.698,"name":"broadcast chunk 0","ph":"X","pid":0,"tid":2,"ts":912.14},
{"args":{"bytes":943656,"op":"broadcast","op_seq":0,"step":-1,"tag":-1,"what":"parameters"},"cat":"collective","dur":362.5,"name":"broadcast parameters","ph":"X","pid":0,"tid":1,"ts":911.029},
{"args":{"bytes":3088},"cat":"collective","dur":0.962,"name":"allreduce grad bucket 0","ph":"X","pid":0,"tid":1,"ts":1281.28},
{"args":{"step":0},"cat":"compute","dur":195.001,"name":"forward","ph":"X","pid":0,"tid":0,"ts":1841.976},
{"args":{"step":0},"cat":"compute","dur":7640.319,"name":"backward","ph":"X","pid":1,"tid":0,"ts":2063.056},
{"args":{"bytes":471828,"chunk":1,"dst":0,"op":"allreduce","op_seq":3,"phase":"reduce-scatter","ring_step":0,"src":1,"step":0,"tag":0,"what":"grad bucket"},"cat":"chunk","dur":108.011,"name":"reduce-scatter chunk 1","ph":"X","pid":1,"tid":2,"ts":9635.815},
{"args":{"bytes":471828,"chunk":0,"dst":0,"op":"allreduce","op_seq":3,"phase":"allgather","ring_step":0,"src":1,"step":0,"tag":0,"what":"grad bucket"},"cat":"chunk","dur":5477.886,"name":"allgather chunk 0","ph":"X","pid":1,"tid":2,"ts":9744.106}]}
)";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 4;
  const bool interrupted = data[0] >= 128;
  const std::string fuzzed(reinterpret_cast<const char*>(data + 1), size - 1);
  const fuzz::ScratchDir& dir = fuzz::scratch();
  const char* const names[4] = {"metrics.jsonl", "summary.json", "trace.json", "config.toml"};
  const char* const valid[4] = {kMetrics, kSummary, kTrace, kConfig};
  for (int f = 0; f < 4; ++f) {
    const std::string path = dir.file(names[f]);
    if (f == which) fuzz::write_file(path, fuzzed);
    else if (interrupted && (f == 1 || f == 2)) std::remove(path.c_str());
    else fuzz::write_file(path, valid[f]);
  }
  try {
    const viz::RunData d = viz::load_run_dir(dir.path());
    (void)d.last_complete_step();
  } catch (const lab::Error&) {
  }
  return 0;
}
