// libFuzzer target: any bytes through the safe pickle reader, the snapshot
// model, every analysis and every renderer. The only acceptable failure is
// an oomtune::Error (a clear message); crashes, sanitizer reports, leaks,
// other exceptions and huge allocations are bugs. load_snapshot_bytes
// (trace events streamed while reading) must read every input exactly as the
// plain read does: the same model, or the same error.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.h"
#include "diagnose/diagnosis.h"
#include "diagnose/pickle_reader.h"
#include "diagnose/render.h"
#include "diagnose/snapshot.h"
#include "tests/diagnose/snapshot_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oomtune::diagnose;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string plain;  // the plain read's model, or its error
  try {
    const PickleDocument doc = read_pickle_bytes(bytes, "fuzz");
    Snapshot snapshot = snapshot_from_pickle(doc.store, doc.root, "fuzz");
    snapshot.file_bytes = doc.bytes_read;
    plain = testing::snapshot_dump(snapshot);
    DiagnoseOptions options;
    options.top = 3;
    const Diagnosis diagnosis = diagnose(snapshot, "fuzz", options);
    (void)render_text(diagnosis);
    (void)render_json(diagnosis);
    (void)render_svg(diagnosis);
    // --compare against itself and against an empty snapshot, both ways.
    const Diagnosis empty = diagnose(Snapshot{}, "empty", options);
    for (const Comparison& c :
         {compare(diagnosis, diagnosis, 3), compare(empty, diagnosis, 3), compare(diagnosis, empty, 3)}) {
      (void)render_compare_text(c);
      (void)render_compare_json(c);
      (void)render_compare_svg(c);
    }
  } catch (const oomtune::Error& e) {
    plain = std::string("error: ") + e.what();
  }
  std::string streamed;
  try {
    streamed = testing::snapshot_dump(load_snapshot_bytes(bytes, "fuzz"));
  } catch (const oomtune::Error& e) {
    streamed = std::string("error: ") + e.what();
  }
  if (streamed != plain) {
    std::fprintf(stderr, "load_snapshot_bytes differs from the plain read:\n--- plain\n%s\n--- streamed\n%s\n",
                 plain.c_str(), streamed.c_str());
    std::abort();
  }
  return 0;
}
