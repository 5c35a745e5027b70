// op_api_symbols.h against stub libcust_opapi.so packages laid out as CANN installs them
// (<entry>/op_api/lib/libcust_opapi.so): a package without the operator reports its entry points missing, one with
// it resolves them, and with both on the path the operator is found wherever it is.
#include "rtp_llm/cpp/ascend/op_api_symbols.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace rtp_llm {
namespace ascend {
namespace {

const char* kOp = "aclnnApplyTopKTopPCustom";

// A package directory holding the stub library `lib` (a data dependency of the test) as its libcust_opapi.so.
std::string package_with(const std::string& lib, const std::string& name) {
    const fs::path root = fs::path(std::getenv("TEST_TMPDIR")) / name / "op_api" / "lib";
    fs::create_directories(root);
    const fs::path src = fs::path(std::getenv("TEST_SRCDIR")) / std::getenv("TEST_WORKSPACE") / "rtp_llm/cpp/ascend" / lib;
    fs::copy_file(src, root / "libcust_opapi.so", fs::copy_options::overwrite_existing);
    return (fs::path(std::getenv("TEST_TMPDIR")) / name).string();
}

TEST(OpApiSymbols, AForeignPackageReportsTheOperatorMissing) {
    OpApiLibraries libs(package_with("libstub_without_op.so", "foreign"), /*system=*/false);
    ASSERT_EQ(libs.loaded(), 1u);
    const auto missing = libs.missing(kOp);
    ASSERT_EQ(missing.size(), 2u);
    EXPECT_EQ(missing[0], "aclnnApplyTopKTopPCustomGetWorkspaceSize");
    EXPECT_EQ(missing[1], "aclnnApplyTopKTopPCustom");
    EXPECT_TRUE(libs.missing("aclnnSomeOtherVendorOp").empty());
}

TEST(OpApiSymbols, OurPackageResolvesBothEntryPoints) {
    OpApiLibraries libs(package_with("libstub_with_op.so", "ours"), /*system=*/false);
    EXPECT_TRUE(libs.missing(kOp).empty());
    EXPECT_NE(libs.symbol("aclnnApplyTopKTopPCustomGetWorkspaceSize"), nullptr);
}

TEST(OpApiSymbols, EveryEntryOfThePathIsSearched) {
    const std::string path = package_with("libstub_without_op.so", "first") + "::/no/such/dir:" +
                             package_with("libstub_with_op.so", "second");
    OpApiLibraries libs(path, /*system=*/false);
    EXPECT_EQ(libs.loaded(), 2u);
    EXPECT_TRUE(libs.missing(kOp).empty());
}

TEST(OpApiSymbols, NothingOnThePathMeansMissing) {
    OpApiLibraries libs("", /*system=*/false);
    EXPECT_EQ(libs.loaded(), 0u);
    EXPECT_EQ(libs.missing(kOp).size(), 2u);
}

}  // namespace
}  // namespace ascend
}  // namespace rtp_llm
