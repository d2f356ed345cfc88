#include "executor.h"

#include <utility>

namespace lab {

namespace {
ExecutorFactory& factory_slot() {
  static ExecutorFactory f;
  return f;
}
}  // namespace

void set_executor_factory(ExecutorFactory f) { factory_slot() = std::move(f); }
const ExecutorFactory& executor_factory() { return factory_slot(); }

}  // namespace lab
