// ApplyTopKTopPCustom: registration with CANN (inputs, dtypes, shape inference, tiling, SOCs).
// Inputs: sorted_value [B, V] ascending (float32/float16/bfloat16), sorted_indices [B, V] int32,
// optional p [B] (same dtype as the values), optional k [B] int32. Output: out [B, V] in the original
// token order: survivors keep their logits, the rest are -inf.
// Compiled by CANN's op_build on a machine with CANN (C++11).
#include "register/op_def_registry.h"

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
ge::graphStatus ApplyTopKTopPCustomTilingFunc(gert::TilingContext* context);
}

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
