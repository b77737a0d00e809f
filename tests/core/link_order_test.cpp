// A program linked to libtorch binds its std::filesystem calls to libstdc++.
//
// PyTorch's wheels (2.5 on) export the std::filesystem functions they link
// statically from their build's older libstdc++ (pytorch/pytorch#133437).
// With libtorch before libstdc++.so.6 in a program's DT_NEEDED order, the
// dynamic linker bound our std::filesystem::remove_all to libtorch_cpu.so's
// copy, which crashed on a folder (PyTorch 2.11 on the GPU machine); the link
// option on oomtune_torch (CMakeLists.txt) names libstdc++ first. Debian's
// libtorch 1.13 exports none of them, so there the lookup finds libstdc++
// either way: this test guards the wheel builds.

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TEST(LinkOrder, StdFilesystemCallsBindToLibstdcxxNotLibtorch) {
  // std::filesystem::remove_all(const path&, std::error_code&), C++11 ABI.
  const char* symbol = "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code";
  void* address = ::dlsym(RTLD_DEFAULT, symbol);  // the definition a call binds to
  ASSERT_NE(address, nullptr) << symbol;
  Dl_info info{};
  ASSERT_NE(::dladdr(address, &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all binds to " << info.dli_fname;

  // And the call that crashed works: a folder with a subfolder and a file.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("oomtune_link_order_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "file") << "x";
  std::error_code error;
  EXPECT_EQ(std::filesystem::remove_all(dir, error), 3u) << error.message();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace oomtune
