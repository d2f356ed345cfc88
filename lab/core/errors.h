// Typed errors raised at the lab's boundaries. main() alone turns them into exit codes
// (documented in the README): library code never calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace lab {

// Exit codes of the dtlab executable, one per error family.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,       // unexpected internal error
  kExitUsage = 2,         // bad flag or bad value of a flag (also PyTorch-style ValueError)
  kExitData = 3,          // dataset missing, truncated or malformed
  kExitIo = 4,            // cannot write the run directory or read a weights file
  kExitTraining = 5,      // a training-time error, e.g. the BatchNorm batch-of-one error
  kExitCommunication = 6, // a rank failed or a collective timed out
  kExitNoDisplay = 7,     // dtlab gui: no display to open a window on, or a build without the GUI
  kExitDevice = 9,        // a GPU problem: no driver, no GPU, a CUDA/cuBLAS/cuDNN/NCCL call failed
  kExitInterrupted = 130, // stopped by SIGINT
};

// Base of all lab errors: a message plus an optional hint shown on its own line.
class Error : public std::runtime_error {
 public:
  Error(const std::string& what, std::string hint = {}) : std::runtime_error(what), m_hint(std::move(hint)) {}
  const std::string& hint() const { return m_hint; }
  virtual int exit_code() const { return kExitFailure; }

 private:
  std::string m_hint;
};

// A bad setting (flag, config value): PyTorch's ValueError wording where PyTorch has one.
class ConfigError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitUsage; }
};

// Dataset problems. The message names the file and what is wrong with it.
class DataError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitData; }
};

// Files the lab reads or writes besides the dataset (run directory, weights).
class IoError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitIo; }
};

// Errors PyTorch would raise during training (e.g. BatchNorm with one value per channel).
class TrainingError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitTraining; }
};

// A collective failed: a peer rank failed, or a blocking operation timed out.
class CommError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitCommunication; }
};

// The GPU backend (backends/cuda): no driver, no GPU, or a failed CUDA, cuBLAS, cuDNN or NCCL call.
// The message names the call and carries the library's own error string; the hint says what to
// check.
class DeviceError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitDevice; }
};

// Throws the error type whose exit_code() is `code` (used to re-raise a rank's error on the
// thread that reports it, with added context).
[[noreturn]] inline void throw_error(int code, const std::string& what, const std::string& hint) {
  switch (code) {
    case kExitUsage: throw ConfigError(what, hint);
    case kExitData: throw DataError(what, hint);
    case kExitIo: throw IoError(what, hint);
    case kExitTraining: throw TrainingError(what, hint);
    case kExitCommunication: throw CommError(what, hint);
    case kExitDevice: throw DeviceError(what, hint);
    default: throw Error(what, hint);
  }
}

}  // namespace lab
