#include "common/class_name.h"

namespace oomtune {
namespace {

constexpr const char* kMangleAtom = "___torch_mangle_";  // c10/util/QualifiedName.h mangling

}  // namespace

std::string unmangled_name(const std::string& qualified) {
  std::string out;
  size_t begin = 0;
  while (begin <= qualified.size()) {
    size_t end = qualified.find('.', begin);
    if (end == std::string::npos) end = qualified.size();
    const std::string atom = qualified.substr(begin, end - begin);
    if (atom.rfind(kMangleAtom, 0) != 0) {
      if (!out.empty()) out += '.';
      out += atom;
    }
    begin = end + 1;
  }
  return out;
}

std::string short_class_name(const std::string& qualified) {
  const auto dot = qualified.rfind('.');
  return dot == std::string::npos ? qualified : qualified.substr(dot + 1);
}

}  // namespace oomtune
