"""rtp_llm/cpp/ascend/op_api_common.h is well-formed C++ against the real torch headers and minimal
declarations of the CANN / torch_npu APIs it uses (no CANN here: compile check only, -fsyntax-only),
and EXEC_NPU_CMD expands to a call with the GetWorkspaceSize / run signatures aclnn defines."""

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUBS = {
    "acl/acl.h": """
        #pragma once
        #include <cstdint>
        typedef void* aclrtStream;
        typedef enum { ACL_FLOAT = 0, ACL_FLOAT16 = 1, ACL_INT8 = 2, ACL_INT32 = 3, ACL_UINT8 = 4, ACL_INT64 = 9,
                       ACL_BOOL = 12, ACL_BF16 = 27 } aclDataType;
        typedef enum { ACL_FORMAT_ND = 2 } aclFormat;
    """,
    "aclnn/acl_meta.h": """
        #pragma once
        #include <cstdint>
        #include "acl/acl.h"
        struct aclTensor; struct aclIntArray; struct aclOpExecutor;
        extern "C" aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType,
            const int64_t* stride, int64_t offset, aclFormat format, const int64_t* storageDims,
            uint64_t storageDimsNum, void* tensorData);
        extern "C" int aclDestroyTensor(const aclTensor* tensor);
        extern "C" aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size);
        extern "C" int aclDestroyIntArray(const aclIntArray* array);
    """,
    "torch_npu/csrc/core/npu/NPUStream.h": """
        #pragma once
        #include "acl/acl.h"
        namespace c10_npu { struct NPUStream { aclrtStream stream(bool need_empty = true) const; };
                            NPUStream getCurrentNPUStream(int device_index = -1); }
    """,
}

USE = """
#include "rtp_llm/cpp/ascend/op_api_common.h"
void call(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
    EXEC_NPU_CMD(aclnnApplyTopKTopPCustom, a, b, out);
    EXEC_NPU_CMD(aclnnSomething, a, at::IntArrayRef({1, 2}), 0.5, int64_t(3), true, out);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ missing")
@pytest.mark.parametrize("source", ["use.cc", "rtp_llm/cpp/ascend/apply_top_k_top_p_custom.cc"])
def test_op_api_common_compiles(tmp_path, source):
    import torch.utils.cpp_extension as ext

    for rel, text in STUBS.items():
        p = tmp_path / "stubs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    src = tmp_path / "use.cc"
    src.write_text(USE)
    if source != "use.cc":
        src = ROOT / source  # the framework call of the AscendC operator
    includes = [f"-I{ROOT}", f"-I{tmp_path / 'stubs'}"] + [f"-isystem{p}" for p in ext.include_paths()]
    res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", *includes, str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
