// The tiling data the host hands the kernel (TILING_DATA_DEF form, CANN 7 and 8). The op-package build
// generates the kernel's GET_TILING_DATA struct from this registration.
#ifndef APPLY_TOP_K_TOP_P_CUSTOM_TILING_DATA_H
#define APPLY_TOP_K_TOP_P_CUSTOM_TILING_DATA_H

#include "register/tilingdata_base.h"

namespace optiling {
BEGIN_TILING_DATA_DEF(ApplyTopKTopPCustomTilingData)
TILING_DATA_FIELD_DEF(uint32_t, batch);
TILING_DATA_FIELD_DEF(uint32_t, vocab);
TILING_DATA_FIELD_DEF(uint32_t, batchPerCore);
TILING_DATA_FIELD_DEF(uint32_t, tailBatch);
TILING_DATA_FIELD_DEF(uint32_t, chunkElements);
TILING_DATA_FIELD_DEF(uint32_t, tailChunkElements);
TILING_DATA_FIELD_DEF(uint32_t, iterateTimes);
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(ApplyTopKTopPCustom, ApplyTopKTopPCustomTilingData)
}  // namespace optiling

#endif  // APPLY_TOP_K_TOP_P_CUSTOM_TILING_DATA_H
