#include "lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lab {

namespace {
constexpr double kPi = 3.141592653589793;  // math.pi
}

LrSchedule::LrSchedule(const LrScheduleOptions& opt) : m_opt(opt), m_lr(opt.lr) {}

void LrSchedule::step() {
  ++m_epoch;
  const double base = m_opt.lr;
  if (m_opt.kind == "cosine") {
    // CosineAnnealingLR.get_lr() in PyTorch 1.13, in the same order of operations.
    const double t = static_cast<double>(m_opt.t_max), e = static_cast<double>(m_epoch), lo = m_opt.eta_min;
    if ((m_epoch - 1 - m_opt.t_max) % (2 * m_opt.t_max) == 0)
      m_lr = m_lr + (base - lo) * (1 - std::cos(kPi / t)) / 2;
    else
      m_lr = (1 + std::cos(kPi * e / t)) / (1 + std::cos(kPi * (e - 1) / t)) * (m_lr - lo) + lo;
  } else if (m_opt.kind == "step") {
    if (m_epoch % m_opt.step_size == 0) m_lr = m_lr * m_opt.gamma;  // StepLR.get_lr()
  }
}

LrScheduleOptions lr_schedule_options(const RunConfig& c, int64_t epochs) {
  LrScheduleOptions o;
  o.kind = c.lr_schedule;
  o.lr = c.lr;
  o.t_max = c.lr_t_max > 0 ? c.lr_t_max : std::max<int64_t>(1, epochs);
  o.eta_min = c.lr_min;
  o.step_size = c.lr_step_size;
  o.gamma = c.lr_gamma;
  return o;
}

}  // namespace lab
