#include "trial/trial_module.h"

#include <dlfcn.h>

#include <array>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune {
namespace {

using ServeTrial = decltype(&oomtune_serve_trial);

constexpr const char* kWhereItBelongs = "it is built beside the oomtune executable and must stay there";

ServeTrial load_serve_trial() {
  const std::string path = trial_module_path("/proc/self/exe");
  void* module = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!module)
    throw Error(fmt::format("{}: cannot load the libtorch trial module ({}); {}", path, ::dlerror(), kWhereItBelongs));
  auto* entry = reinterpret_cast<ServeTrial>(::dlsym(module, "oomtune_serve_trial"));
  if (!entry) throw Error(fmt::format("{}: not an oomtune trial module (no oomtune_serve_trial)", path));
  return entry;  // the module stays loaded until the process ends
}

}  // namespace

std::string trial_module_path(const std::string& executable) {
  std::error_code ec;
  std::filesystem::path resolved = std::filesystem::canonical(executable, ec);
  if (ec) resolved = executable;
  return (resolved.parent_path() / "liboomtune_trial_module.so").string();
}

void require_trial_module(const std::string& executable) {
  // Linux names a running executable whose file was deleted or replaced
  // (a rebuild) "PATH (deleted)" (proc(5), /proc/pid/exe): its directory,
  // and the module beside it, are no longer where it runs from.
  std::error_code ec;
  const std::string link = std::filesystem::read_symlink(executable, ec).string();
  const std::string deleted = " (deleted)";
  if (!ec && link.size() > deleted.size() && link.compare(link.size() - deleted.size(), deleted.size(), deleted) == 0)
    throw Error(fmt::format("{}: the oomtune executable was replaced or removed while it ran (rebuilt?); run it again",
                            link.substr(0, link.size() - deleted.size())));
  const std::string path = trial_module_path(executable);
  if (!std::filesystem::exists(path))
    throw Error(fmt::format("{}: the libtorch trial module is missing; {}", path, kWhereItBelongs));
}

int serve_trial_from_module(const std::string& request_path, const std::string& result_path) {
  static const ServeTrial serve = load_serve_trial();
  std::array<char, 4096> message{};
  const int code = serve(request_path.c_str(), result_path.c_str(), message.data(), message.size());
  if (code == kExitOk) return code;
  if (code == kExitBadInput) throw InputError(message.data());
  throw Error(message.data());
}

}  // namespace oomtune
