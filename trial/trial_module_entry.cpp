// The export of liboomtune_trial_module.so (trial/trial_module.h): the
// child side of a trial, behind a C boundary. Errors stop here, as they
// would in main(), and travel back as an exit code and a message.

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "common/error.h"
#include "trial/serve_trial.h"
#include "trial/trial_module.h"

namespace {

int fail(int code, const std::string& text, char* message, std::size_t message_size) {
  if (message_size > 0) {
    const std::size_t n = std::min(text.size(), message_size - 1);
    std::memcpy(message, text.data(), n);
    message[n] = '\0';
  }
  return code;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int oomtune_serve_trial(const char* request_path,
                                                                          const char* result_path, char* message,
                                                                          std::size_t message_size) {
  try {
    return oomtune::serve_trial(request_path, result_path);
  } catch (const oomtune::Error& e) {
    return fail(e.exit_code(), e.what(), message, message_size);
  } catch (const std::exception& e) {
    return fail(oomtune::kExitFailure, std::string("internal error: ") + e.what(), message, message_size);
  }
}
