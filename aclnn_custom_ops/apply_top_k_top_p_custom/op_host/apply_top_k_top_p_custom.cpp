// ApplyTopKTopPCustom: registration with CANN (inputs, dtypes, shape inference, tiling, SOCs) and its
// TilingFunc, in one source as msopgen lays op_host out (the proto and tiling libraries both build it).
// Inputs: sorted_value [B, V] ascending (float32/float16/bfloat16), sorted_indices [B, V] int32,
// optional p [B] (same dtype as the values), optional k [B] int32. Output: out [B, V] in the original
// token order: survivors keep their logits, the rest are -inf. op_build generates the aclnn wrapper
// aclnnApplyTopKTopPCustom(sortedValue, sortedIndices, pOptional, kOptional, out) from this OpDef.
// Compiled as C++17 by CANN's op-package build (build_for_bazel.sh) on a machine with CANN.
#include "apply_top_k_top_p_custom_tiling.h"
#include "apply_top_k_top_p_custom_tiling_plan.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace ge {
static graphStatus InferShapeApplyTopKTopPCustom(gert::InferShapeContext* context) {
    const gert::Shape* values = context->GetInputShape(0);
    gert::Shape* out = context->GetOutputShape(0);
    *out = *values;
    return GRAPH_SUCCESS;
}

static graphStatus InferDataTypeApplyTopKTopPCustom(gert::InferDataTypeContext* context) {
    context->SetOutputDataType(0, context->GetInputDataType(0));
    return GRAPH_SUCCESS;
}
}  // namespace ge

namespace optiling {
// Reads shapes, dtype and the platform (AIV cores, UB bytes), runs the plain tiling plan (unit-tested on
// the host), stores the result.
static ge::graphStatus ApplyTopKTopPCustomTilingFunc(gert::TilingContext* context) {
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

namespace ops {
class ApplyTopKTopPCustom : public OpDef {
public:
    explicit ApplyTopKTopPCustom(const char* name) : OpDef(name) {
        this->Input("sorted_value")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Input("sorted_indices")
            .ParamType(REQUIRED)
            .DataType({ge::DT_INT32, ge::DT_INT32, ge::DT_INT32})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Input("p")
            .ParamType(OPTIONAL)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Input("k")
            .ParamType(OPTIONAL)
            .DataType({ge::DT_INT32, ge::DT_INT32, ge::DT_INT32})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Output("out")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->SetInferShape(ge::InferShapeApplyTopKTopPCustom)
            .SetInferDataType(ge::InferDataTypeApplyTopKTopPCustom);
        this->AICore().SetTiling(optiling::ApplyTopKTopPCustomTilingFunc);
        this->AICore().AddConfig("ascend910b");
        this->AICore().AddConfig("ascend910_93");
    }
};

OP_ADD(ApplyTopKTopPCustom);
}  // namespace ops
