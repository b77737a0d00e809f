#include "common/class_name.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

// Names as TorchScript writes them for a class compiled twice (torchvision's
// BasicBlock in a scripted ResNet) and for a top-level Python class.
TEST(ClassName, MangleAtomsAreDroppedWhereverTheyStand) {
  EXPECT_EQ(unmangled_name("__torch__.torchvision.models.resnet.___torch_mangle_12.BasicBlock"),
            "__torch__.torchvision.models.resnet.BasicBlock");
  EXPECT_EQ(unmangled_name("__torch__.___torch_mangle_3.Halving"), "__torch__.Halving");
  EXPECT_EQ(unmangled_name("__torch__.Halving"), "__torch__.Halving");
  EXPECT_EQ(unmangled_name("__torch__.a.___torch_mangle_1.b.___torch_mangle_20.C"), "__torch__.a.b.C");
  // An atom that only contains the mangle prefix later is a real name.
  EXPECT_EQ(unmangled_name("__torch__.my___torch_mangle_7.Block"), "__torch__.my___torch_mangle_7.Block");
}

TEST(ClassName, TheShortNameIsTheLastAtom) {
  EXPECT_EQ(short_class_name("__torch__.torchvision.models.resnet.BasicBlock"), "BasicBlock");
  EXPECT_EQ(short_class_name("__torch__.Halving"), "Halving");
  EXPECT_EQ(short_class_name("Halving"), "Halving");
}

}  // namespace
}  // namespace oomtune
