#include "session/model_file.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>

#include "common/file_magic.h"

namespace oomtune {
namespace {

std::string read_head(const std::string& path, size_t bytes) {
  std::ifstream file(path, std::ios::binary);
  std::string head(bytes, '\0');
  file.read(head.data(), static_cast<std::streamsize>(bytes));
  head.resize(file ? bytes : static_cast<size_t>(std::max<std::streamsize>(file.gcount(), 0)));
  return head;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

/// What a torch.save pickle (protocol 2, torch/serialization.py
/// DEFAULT_PROTOCOL) holds, from its first opcodes: PROTO 2, then GLOBAL
/// "module\nname\n" for an object (an OrderedDict is a state_dict) or
/// EMPTY_DICT for a plain dict (a checkpoint holding state_dicts).
std::string torch_save_contents(std::string_view pickle) {
  if (pickle.size() < 3 || pickle[0] != '\x80') return "a torch.save file";
  if (pickle[2] == '}') return "a torch.save file holding a dict (a checkpoint or a state_dict: weights only)";
  if (pickle[2] != 'c') return "a torch.save file";
  const size_t module_end = pickle.find('\n', 3);
  const size_t name_end = module_end == std::string_view::npos ? module_end : pickle.find('\n', module_end + 1);
  if (name_end == std::string_view::npos) return "a torch.save file";
  const std::string_view module = pickle.substr(3, module_end - 3);
  const std::string_view name = pickle.substr(module_end + 1, name_end - module_end - 1);
  if (module == "collections" && name == "OrderedDict") return "a torch.save file holding a state_dict (weights only)";
  return fmt::format("a torch.save file holding a pickled {}.{}", module, name);
}

/// A zip archive's kind from its record names (libtorch's own reader, which
/// strips the archive's top folder).
std::string zip_kind(const std::string& path) {
  std::vector<std::string> records;
  std::string data_pkl;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    records = reader.getAllRecords();
    if (reader.hasRecord("data.pkl")) {
      auto [data, size] = reader.getRecord("data.pkl");
      data_pkl.assign(static_cast<const char*>(data.get()), std::min<size_t>(size, 256));
    }
  } catch (const std::exception&) {
    return "";  // not written by torch: nothing to say beyond libtorch's message
  }
  bool code = false;
  bool constants = false;
  bool archive_format = false;
  for (const std::string& r : records) {
    code |= r.rfind("code/", 0) == 0;
    constants |= r == "constants.pkl";
    archive_format |= r == "archive_format";
  }
  if (code || constants) return "";  // TorchScript
  if (archive_format) return "a torch.export program (torch.export.save, PT2 archive)";
  if (!data_pkl.empty()) return torch_save_contents(data_pkl);
  return "";
}

/// torch.save's pre-1.6 format starts with the pickled magic number
/// 0x1950a86a20f9469cfc6c (torch/serialization.py, MAGIC_NUMBER) as LONG1.
bool is_legacy_torch_save(std::string_view head) {
  static constexpr unsigned char kMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                             0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  return head.size() >= sizeof(kMagic) && std::memcmp(head.data(), kMagic, sizeof(kMagic)) == 0;
}

/// safetensors: u64 little-endian header length N, then N bytes of JSON.
bool is_safetensors(std::string_view head, uintmax_t file_size) {
  if (head.size() < 9 || head[8] != '{') return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(head[static_cast<size_t>(i)]);
  return n >= 2 && n <= file_size - 8;
}

}  // namespace

std::string non_torchscript_kind(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(std::filesystem::path(path) / "config.json", ec)) {
      return "a folder holding config.json (a Hugging Face model folder?)";
    }
    return "a folder";
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return "";
  const std::string head = read_head(path, 16);
  if (starts_like_zip(head)) return zip_kind(path);
  if (is_legacy_torch_save(head)) return "a torch.save file in the pre-1.6 format";
  if (is_safetensors(head, size)) return "a safetensors file (weights only)";
  if (head.rfind("GGUF", 0) == 0) return "a GGUF file (llama.cpp weights)";
  if (ends_with(path, ".onnx")) return "an ONNX model";
  if (!head.empty() && head[0] == '\x80') return "a Python pickle";
  return "";
}

bool is_zip_archive(const std::string& path) {
  std::error_code ec;
  return !std::filesystem::is_directory(path, ec) && starts_like_zip(read_head(path, 4));
}

std::string truncated_zip(const std::string& path) {
  if (!is_zip_archive(path)) return "";
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return "";
  constexpr uintmax_t kEndRecordBytes = 22;     // the record without its comment
  constexpr uintmax_t kLongestComment = 65535;  // a 16-bit comment length
  const uintmax_t tail_bytes = std::min<uintmax_t>(size, kEndRecordBytes + kLongestComment);
  std::ifstream file(path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(size - tail_bytes));
  std::string tail(static_cast<size_t>(tail_bytes), '\0');
  file.read(tail.data(), static_cast<std::streamsize>(tail_bytes));
  if (!file) return "";
  if (tail.find(std::string_view("PK\5\6", 4)) != std::string::npos) return "";
  return fmt::format(
      "cut short: a zip archive of {} bytes without its end (the central directory, which a zip "
      "writes last)",
      size);
}

std::string how_to_export_torchscript() {
  return "oomtune trains a TorchScript model (code and weights in one file): export yours with "
         "torch.jit.script(model).save(\"model.pt\") or torch.jit.trace(model, example_inputs).save(\"model.pt\") "
         "(README: \"Your own model\")";
}

}  // namespace oomtune
