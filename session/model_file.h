#pragma once
// What a model file is when it is not TorchScript, so that a load error can
// say so and how to export: the common mistakes are a state_dict or a whole
// pickled module (torch.save), weights in safetensors, a torch.export
// program (.pt2) or a Hugging Face model folder.

#include <string>

namespace oomtune {

/// Names the kind of a model file or folder that is not TorchScript, as a
/// phrase that completes "PATH is ...": "a torch.save file holding a
/// state_dict (weights only)", "a torch.export program (torch.export.save,
/// PT2 archive)", etc. Returns "" for a TorchScript archive and for anything
/// it cannot tell (the caller then keeps libtorch's own message).
///
/// Read from the file's first bytes and, for zip archives, its record names
/// (caffe2/serialize/inline_container.h, PyTorchStreamReader):
///   TorchScript        code/ and constants.pkl (torch/csrc/jit/serialization/export_module.cpp)
///   torch.save         data.pkl without code/ (torch/serialization.py, _save);
///                      a state_dict's pickle starts with collections.OrderedDict
///   legacy torch.save  a bare pickle, PROTO opcode 0x80 first (torch < 1.6 format)
///   PT2 archive        an `archive_format` record (torch/export/pt2_archive/constants.py)
///   safetensors        8-byte little-endian header length, then '{' (safetensors format spec)
///   ONNX               the .onnx extension (a protobuf has no magic number)
///   GGUF               the magic "GGUF"
/// Throws nothing: an unreadable file is "".
std::string non_torchscript_kind(const std::string& path);

/// True when the file at `path` starts with a zip local-file header ("PK\3\4"),
/// as every TorchScript archive does (torch.jit.save writes a zip). False for
/// a folder or an unreadable file.
bool is_zip_archive(const std::string& path);

/// For a zip archive (is_zip_archive) without the end-of-central-directory
/// record, the signature "PK\5\6" within the file's last 22 + 65535 bytes
/// (the record and the longest comment it may carry; PKWARE APPNOTE.TXT,
/// 4.3.16): a phrase completing "PATH is ...", "cut short: a zip archive of
/// N bytes without its end (the central directory, which a zip writes
/// last)". Every zip writer, torch.jit.save's (miniz) included, ends the
/// archive with that record, a ZIP64 one too; a file without it was
/// truncated (an interrupted copy, download or save), which libtorch
/// reports as "failed finding central directory". "" for a complete
/// archive, anything else, or an unreadable file. Throws nothing.
std::string truncated_zip(const std::string& path);

/// The sentence a load error adds after the kind: oomtune needs the model's
/// code as well as its weights, and the two ways to export it.
std::string how_to_export_torchscript();

}  // namespace oomtune
