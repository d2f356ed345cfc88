// Help (F1): the keys, and what each view is for.
#include "draw.h"
#include "panels.h"

namespace viz {

void draw_help_window(bool* open) {
  if (!*open) return;
  const ImVec2 c = ImGui::GetMainViewport()->GetCenter();
  ImGui::SetNextWindowPos(c, ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(ImGui::GetFontSize() * 40, 0), ImGuiCond_Appearing);
  if (!ImGui::Begin("Help", open, ImGuiWindowFlags_NoCollapse)) {
    ImGui::End();
    return;
  }
  heading("Keys");
  const char* keys[][2] = {{"Space", "play / pause"},
                           {"Right arrow", "one step of a collective (a ring step: every rank sends one chunk)"},
                           {"Shift + Right", "one iteration"},
                           {"R", "reset: a new run with the settings in the Controls panel"},
                           {"S", "screenshot of the window (PNG in the current directory)"},
                           {"1 ... 9", "allreduce, BatchNorm, batching, train vs eval, benchmark, memory, pipeline, grid, scale view"},
                           {"F1", "this help"}};
  if (ImGui::BeginTable("keys", 2, ImGuiTableFlags_SizingFixedFit)) {
    ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed);
    ImGui::TableSetupColumn("what", ImGuiTableColumnFlags_WidthStretch);
    for (const auto& k : keys) {
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(k[0]);
      ImGui::TableNextColumn();
      ImGui::TextWrapped("%s", k[1]);
    }
    ImGui::EndTable();
  }
  ImGui::Separator();
  heading("Views");
  ImGui::TextWrapped("Allreduce: how the gradients are summed, by the algorithm chosen in Settings. A ring has each "
                     "rank send 2(N-1)/N of the buffer in 2(N-1) steps; naive sends everything through rank 0; the "
                     "tree halves and doubles in 2 log2(N) steps. Local SGD also shows its parameter averages; "
                     "DataParallel its reduce of every device's gradients into device 0 (no allreduce). Hover any "
                     "number for its formula.");
  ImGui::TextWrapped("BatchNorm: each rank's batch statistics next to the global ones, and the running statistics "
                     "over time. 'twin run' trains the other BN mode on the same data to compare.");
  ImGui::TextWrapped("Batching: the epoch as DistributedSampler and the DataLoader cut it (DataParallel: its one "
                     "DataLoader and torch.chunk): padding, drop_last, the short last batch, and the batch-of-one "
                     "BatchNorm failure.");
  ImGui::TextWrapped("Train vs eval: test accuracy with batch statistics (train mode) and running statistics (eval "
                     "mode) over time (--eval-every N; without it, where each epoch ended and at the end).");
  ImGui::TextWrapped("Benchmark: a `dtlab bench train --batch-sizes ... --per-sample` result (ms per sample against "
                     "the batch size, and one sample at a time) or a `dtlab bench chain` result (every order of a "
                     "matrix chain: time, FLOPs, thread scaling). Open its --json file with File > Open or --open.");
  ImGui::TextWrapped("Memory: each rank's bytes by category (parameters, gradients, optimizer state, activations, "
                     "communication buffers, gathered parameters) at a point of an iteration, the iteration's curve "
                     "point by point (FSDP's all-gather, use, free), and the ZeRO paper's formula with the run's "
                     "numbers.");
  ImGui::TextWrapped("Pipeline (--mode pipeline): stages by time, each micro-batch's forward and backward as a block, "
                     "the idle time shaded; one iteration as recorded and the schedule with equal stages, the bubble "
                     "measured, played and by the formula (p-1)/(m+p-1), and per stage the micro-batches in flight "
                     "with their activations.");
  ImGui::TextWrapped("Grid: the ranks placed on the grid of data, pipeline and tensor parallelism (--dp with --mode "
                     "pipeline or tensor; every other mode is one data-parallel group): which ranks form which group, "
                     "what travels in each kind of group and its bytes in an iteration.");
  ImGui::TextWrapped("Scale: collectives on 8 to 4,096 GPUs from the simulator (`dtlab simulate`): the cluster for "
                     "the chosen N, busbw and time against N with the time split into latency, bandwidth and "
                     "contention, busbw against the size with the size where ring overtakes NCCL's tree. A run "
                     "trained with the link model (--link-gbps) adds its own measured allreduces beside the "
                     "simulator's prediction for its link.");
  ImGui::Separator();
  ImGui::TextWrapped("Headless: `dtlab run` trains with the same flags and writes a run directory (--out DIR); "
                     "`dtlab gui --open DIR` shows it here again, as a recording: the views' own sliders move through "
                     "it; play, pause, the steps and the speed are for live runs.");
  ImGui::End();
}

}  // namespace viz
