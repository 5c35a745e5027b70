// A stand-in libcust_opapi.so: with STUB_HAS_OP it defines aclnnApplyTopKTopPCustom's two entry points (as this
// project's package does), without it only another vendor's operator (as a foreign ASCEND_CUSTOM_OPP_PATH entry).
#include <cstdint>

extern "C" {
#ifdef STUB_HAS_OP
int aclnnApplyTopKTopPCustomGetWorkspaceSize(void*, void*, void*, void*, void*, uint64_t*, void**) { return 0; }
int aclnnApplyTopKTopPCustom(void*, uint64_t, void*, void*) { return 0; }
#endif
int aclnnSomeOtherVendorOpGetWorkspaceSize(void*, uint64_t*, void**) { return 0; }
int aclnnSomeOtherVendorOp(void*, uint64_t, void*, void*) { return 0; }
}
