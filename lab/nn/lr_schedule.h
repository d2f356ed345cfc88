// LrSchedule: the learning rate per epoch, as PyTorch's schedulers give it when the training loop
// calls scheduler.step() once at the end of every epoch.
//   constant: lr in every epoch
//   cosine:   torch.optim.lr_scheduler.CosineAnnealingLR(T_max, eta_min), by its own recursive
//             formula (not the closed form), so the rates are PyTorch's to the last bit
//   step:     torch.optim.lr_scheduler.StepLR(step_size, gamma): lr * gamma every step_size epochs
#pragma once

#include <cstdint>
#include <string>

#include "config.h"

namespace lab {

struct LrScheduleOptions {
  std::string kind = "constant";  // constant | cosine | step
  double lr = 0.05;               // the base rate (the optimizer's lr)
  int64_t t_max = 1;              // cosine: epochs of one half period
  double eta_min = 0.0;           // cosine: the lowest rate
  int64_t step_size = 1;          // step: epochs between decays
  double gamma = 0.1;             // step: the decay factor
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& opt);
  double lr() const { return m_lr; }  // the rate of the current epoch
  void step();                        // the end of an epoch: the next epoch's rate

 private:
  LrScheduleOptions m_opt;
  int64_t m_epoch = 0;  // PyTorch's last_epoch
  double m_lr;
};

// A configuration's schedule (--lr-schedule and its settings); cosine's T_max defaults to the
// epochs the run trains.
LrScheduleOptions lr_schedule_options(const RunConfig& c, int64_t epochs);

}  // namespace lab
