// TilingFunc: reads shapes, dtype and the platform (AIV cores, UB bytes), runs the plain tiling
// arithmetic of apply_top_k_top_p_custom_tiling.h (unit-tested on the host), stores the result.
#include "apply_top_k_top_p_custom_tiling.h"
#include "apply_top_k_top_p_custom_tiling_data.h"
#include "tiling/platform/platform_ascendc.h"

namespace optiling {
ge::graphStatus ApplyTopKTopPCustomTilingFunc(gert::TilingContext* context) {
    const gert::StorageShape* values = context->GetInputShape(0);
    if (values == nullptr || values->GetStorageShape().GetDimNum() != 2) return ge::GRAPH_FAILED;
    const uint32_t batch = static_cast<uint32_t>(values->GetStorageShape().GetDim(0));
    const uint32_t vocab = static_cast<uint32_t>(values->GetStorageShape().GetDim(1));
    const ge::DataType dtype = context->GetInputDesc(0)->GetDataType();
    const uint32_t dtypeBytes = dtype == ge::DT_FLOAT ? 4u : 2u;
    const bool hasP = context->GetOptionalInputShape(2) != nullptr;
    const bool hasK = context->GetOptionalInputShape(3) != nullptr;

    platform_ascendc::PlatformAscendC platform(context->GetPlatformInfo());
    uint64_t ubBytes = 0;
    platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ubBytes);
    apply_top_k_top_p::TilingParams t;
    if (apply_top_k_top_p::ComputeTiling(batch, vocab, dtypeBytes, platform.GetCoreNumAiv(), ubBytes, hasK, hasP,
                                         &t) != 0) {
        return ge::GRAPH_FAILED;
    }
    ApplyTopKTopPCustomTilingData data;
    data.set_batch(t.batch);
    data.set_vocab(t.vocab);
    data.set_batchPerCore(t.batchPerCore);
    data.set_tailBatch(t.tailBatch);
    data.set_chunkElements(t.chunkElements);
    data.set_tailChunkElements(t.tailChunkElements);
    data.set_iterateTimes(t.iterateTimes);
    data.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
    context->GetRawTilingData()->SetDataSize(data.GetDataSize());
    context->SetBlockDim(t.usedCores);
    context->SetTilingKey(t.tilingKey);
    size_t* workspace = context->GetWorkspaceSizes(1);
    workspace[0] = platform.GetLibApiWorkSpaceSize();
    return ge::GRAPH_SUCCESS;
}
}  // namespace optiling
