// AscendC kernel of ApplyTopKTopPCustom. Same per-row walk as op_host/apply_top_k_top_p_custom_reference.h
// (which the host gtest checks against the documented algorithm):
//   out row := -inf;  threshold = sorted[V - k] (ties kept);  max = sorted[V - 1];
//   pass 1: total = sum over survivors of exp(x - max), chunk by chunk (vector Exp + ReduceSum);
//   pass 2: cumulative sum of exp(x - max) / total with a carry across chunks; a survivor is kept when
//           the sum passes 1 - p (the largest always); kept values are written to out[row, index].
// Rows are split over cores by the tiling. Pipe rules kept here (tests/build/test_aclnn_custom_ops.py
// checks them): a scalar read of UB after vector work waits on a V->S event, vector work after scalar
// UB writes waits on S->V, and global memory is written by DMA only (DataCopyPad), never by
// GlobalTensor::SetValue, whose 64-byte cache-line write-back could clobber a neighbouring core's row.
// The cumulative sum and the scatter are scalar loops: correct first; AscendC::CumSum and a gathered
// write are the next step for speed. Compiled by bisheng on a CANN machine only.
#include "kernel_operator.h"

using namespace AscendC;

namespace {
constexpr int32_t BUFFER_NUM = 2;
constexpr uint32_t kBlockBytes = 32;  // one UB block: the staging slot of a scattered element

template <typename T>
__aicore__ inline float AsFloat(T x) {
    if constexpr (IsSameType<T, bfloat16_t>::value) {
        return ToFloat(x);  // ToFloat is defined for bfloat16_t only
    } else {
        return static_cast<float>(x);
    }
}

template <HardEvent E>
__aicore__ inline void WaitPipe() {
    event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(E));
    SetFlag<E>(ev);
    WaitFlag<E>(ev);
}

template <typename T>
class ApplyTopKTopP {
public:
    __aicore__ inline ApplyTopKTopP() {}

    __aicore__ inline void Init(GM_ADDR sorted, GM_ADDR indices, GM_ADDR p, GM_ADDR k, GM_ADDR out, uint32_t batch,
                                uint32_t vocab, uint32_t batchPerCore, uint32_t tailBatch, uint32_t chunk,
                                uint32_t tailChunk, uint32_t iterate, bool useK, bool useP) {
        vocab_ = vocab;
        chunk_ = chunk;
        tailChunk_ = tailChunk;
        iterate_ = iterate;
        useK_ = useK;
        useP_ = useP;
        const uint32_t core = GetBlockIdx();
        const uint32_t extra = core < tailBatch ? core : tailBatch;
        firstRow_ = core * batchPerCore + extra;
        rows_ = batchPerCore + (core < tailBatch ? 1 : 0);
        sortedGm_.SetGlobalBuffer((__gm__ T*)sorted, static_cast<uint64_t>(batch) * vocab);
        indicesGm_.SetGlobalBuffer((__gm__ int32_t*)indices, static_cast<uint64_t>(batch) * vocab);
        outGm_.SetGlobalBuffer((__gm__ T*)out, static_cast<uint64_t>(batch) * vocab);
        if (useP) pGm_.SetGlobalBuffer((__gm__ T*)p, batch);
        if (useK) kGm_.SetGlobalBuffer((__gm__ int32_t*)k, batch);
        pipe_.InitBuffer(valueQue_, BUFFER_NUM, chunk * sizeof(T));
        pipe_.InitBuffer(indexQue_, BUFFER_NUM, chunk * sizeof(int32_t));
        pipe_.InitBuffer(fillBuf_, chunk * sizeof(T));
        pipe_.InitBuffer(expBuf_, chunk * sizeof(float));
        pipe_.InitBuffer(reduceBuf_, chunk * sizeof(float));
        pipe_.InitBuffer(reduceTmpBuf_, chunk * sizeof(float));
        pipe_.InitBuffer(stageBuf_, kBlockBytes);
    }

    __aicore__ inline void Process() {
        for (uint32_t r = 0; r < rows_; ++r) Row(firstRow_ + r);
    }

    // Tiling key 3 (V == 1, or neither top-k nor top-p): out[row, indices[i]] = sorted[i].
    __aicore__ inline void ProcessCopy() {
        for (uint32_t r = 0; r < rows_; ++r) {
            const uint64_t base = static_cast<uint64_t>(firstRow_ + r) * vocab_;
            for (uint32_t c = 0; c < iterate_; ++c) {
                const uint32_t n = Len(c);
                CopyIn(base + static_cast<uint64_t>(c) * chunk_, n, true);
                LocalTensor<T> v = valueQue_.DeQue<T>();
                LocalTensor<int32_t> idx = indexQue_.DeQue<int32_t>();
                PipeBarrier<PIPE_ALL>();  // the copy-in is done before the scalar unit reads it
                for (uint32_t i = 0; i < n; ++i) Scatter(base + static_cast<uint64_t>(idx.GetValue(i)), v.GetValue(i));
                valueQue_.FreeTensor(v);
                indexQue_.FreeTensor(idx);
            }
        }
    }

private:
    __aicore__ inline uint32_t Len(uint32_t c) const { return c + 1 == iterate_ ? tailChunk_ : chunk_; }

    __aicore__ inline void CopyIn(uint64_t base, uint32_t n, bool withIndices) {
        LocalTensor<T> v = valueQue_.AllocTensor<T>();
        DataCopyPad(v, sortedGm_[base], DataCopyExtParams{1, static_cast<uint32_t>(n * sizeof(T)), 0, 0, 0},
                    DataCopyPadExtParams<T>{false, 0, 0, 0});
        valueQue_.EnQue(v);
        if (withIndices) {
            LocalTensor<int32_t> i = indexQue_.AllocTensor<int32_t>();
            DataCopyPad(i, indicesGm_[base], DataCopyExtParams{1, static_cast<uint32_t>(n * sizeof(int32_t)), 0, 0, 0},
                        DataCopyPadExtParams<int32_t>{false, 0, 0, 0});
            indexQue_.EnQue(i);
        }
    }

    // One element to global memory by DMA: scalar -> staging slot, S->MTE3, copy out, MTE3->S (the slot is
    // free again). DataCopyPad writes exactly sizeof(T) bytes, so rows of other cores are never touched.
    __aicore__ inline void Scatter(uint64_t offset, T x) {
        LocalTensor<T> stage = stageBuf_.Get<T>();
        stage.SetValue(0, x);
        WaitPipe<HardEvent::S_MTE3>();
        DataCopyPad(outGm_[offset], stage, DataCopyExtParams{1, static_cast<uint32_t>(sizeof(T)), 0, 0, 0});
        WaitPipe<HardEvent::MTE3_S>();
    }

    // The output row starts as -inf (bit patterns: float 0xFF800000, half 0xFC00, bfloat16 0xFF80).
    __aicore__ inline void FillRow(uint64_t base) {
        LocalTensor<T> fill = fillBuf_.Get<T>();
        if constexpr (sizeof(T) == 4) {
            LocalTensor<int32_t> bits = fill.template ReinterpretCast<int32_t>();
            Duplicate(bits, static_cast<int32_t>(0xFF800000u), chunk_);
        } else {
            LocalTensor<int16_t> bits = fill.template ReinterpretCast<int16_t>();
            Duplicate(bits, static_cast<int16_t>(IsSameType<T, half>::value ? 0xFC00u : 0xFF80u), chunk_);
        }
        WaitPipe<HardEvent::V_MTE3>();
        for (uint32_t c = 0; c < iterate_; ++c) {
            DataCopyPad(outGm_[base + static_cast<uint64_t>(c) * chunk_], fill,
                        DataCopyExtParams{1, static_cast<uint32_t>(Len(c) * sizeof(T)), 0, 0, 0});
        }
        WaitPipe<HardEvent::MTE3_V>();  // the next row's Duplicate must not overwrite fill under the copy
    }

    // exp(x - max) for survivors, 0 for values below the threshold, into expBuf_ (float).
    __aicore__ inline void ExpChunk(LocalTensor<T>& v, uint32_t n, float mx, float threshold) {
        LocalTensor<float> e = expBuf_.Get<float>();
        if constexpr (IsSameType<T, float>::value) {
            DataCopy(e, v, (n + 7) / 8 * 8);
        } else {
            Cast(e, v, RoundMode::CAST_NONE, n);
        }
        WaitPipe<HardEvent::V_S>();  // the scalar loop reads what the vector unit wrote
        for (uint32_t i = 0; i < n; ++i) {  // below-threshold -> -3e38 so exp gives 0
            if (e.GetValue(i) < threshold) e.SetValue(i, -3.0e38f);
        }
        WaitPipe<HardEvent::S_V>();  // the vector unit reads what the scalar loop wrote
        Adds(e, e, -mx, n);
        PipeBarrier<PIPE_V>();
        Exp(e, e, n);
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void Row(uint32_t row) {
        const uint64_t base = static_cast<uint64_t>(row) * vocab_;
        FillRow(base);
        int32_t k = useK_ ? kGm_.GetValue(row) : static_cast<int32_t>(vocab_);
        if (k < 1) k = 1;
        if (static_cast<uint32_t>(k) > vocab_) k = static_cast<int32_t>(vocab_);
        const float threshold = AsFloat(sortedGm_.GetValue(base + vocab_ - k));
        const float mx = AsFloat(sortedGm_.GetValue(base + vocab_ - 1));
        const float p = useP_ ? AsFloat(pGm_.GetValue(row)) : 1.0f;

        float total = 0.f;  // pass 1
        for (uint32_t c = 0; c < iterate_; ++c) {
            const uint32_t n = Len(c);
            CopyIn(base + static_cast<uint64_t>(c) * chunk_, n, false);
            LocalTensor<T> v = valueQue_.DeQue<T>();
            ExpChunk(v, n, mx, threshold);
            LocalTensor<float> e = expBuf_.Get<float>();
            LocalTensor<float> red = reduceBuf_.Get<float>();
            LocalTensor<float> tmp = reduceTmpBuf_.Get<float>();
            ReduceSum(red, e, tmp, n);
            WaitPipe<HardEvent::V_S>();
            total += red.GetValue(0);
            valueQue_.FreeTensor(v);
        }
        const float inv = 1.f / total;

        float carry = 0.f;  // pass 2
        for (uint32_t c = 0; c < iterate_; ++c) {
            const uint32_t n = Len(c);
            CopyIn(base + static_cast<uint64_t>(c) * chunk_, n, true);
            LocalTensor<T> v = valueQue_.DeQue<T>();
            LocalTensor<int32_t> idx = indexQue_.DeQue<int32_t>();
            ExpChunk(v, n, mx, threshold);
            LocalTensor<float> e = expBuf_.Get<float>();
            Muls(e, e, inv, n);
            WaitPipe<HardEvent::V_S>();
            for (uint32_t i = 0; i < n; ++i) {
                const T x = v.GetValue(i);
                if (AsFloat(x) < threshold) continue;
                carry += e.GetValue(i);
                const bool last = c + 1 == iterate_ && i + 1 == n;
                if (!useP_ || last || carry > 1.f - p) Scatter(base + static_cast<uint64_t>(idx.GetValue(i)), x);
            }
            WaitPipe<HardEvent::S_V>();  // the next chunk's vector work overwrites e
            valueQue_.FreeTensor(v);
            indexQue_.FreeTensor(idx);
        }
    }

    TPipe pipe_;
    TQue<QuePosition::VECIN, BUFFER_NUM> valueQue_, indexQue_;
    TBuf<TPosition::VECCALC> fillBuf_, expBuf_, reduceBuf_, reduceTmpBuf_, stageBuf_;
    GlobalTensor<T> sortedGm_, outGm_, pGm_;
    GlobalTensor<int32_t> indicesGm_, kGm_;
    uint32_t vocab_ = 0, chunk_ = 0, tailChunk_ = 0, iterate_ = 0, firstRow_ = 0, rows_ = 0;
    bool useK_ = false, useP_ = false;
};
}  // namespace

// Inputs in OpDef order (optional ones included), the output, workspace, tiling.
extern "C" __global__ __aicore__ void apply_top_k_top_p_custom(GM_ADDR sorted_value, GM_ADDR sorted_indices,
                                                               GM_ADDR p, GM_ADDR k, GM_ADDR out, GM_ADDR workspace,
                                                               GM_ADDR tiling) {
    GET_TILING_DATA(t, tiling);
    ApplyTopKTopP<DTYPE_SORTED_VALUE> op;
    // one branch per tiling key of op_host/apply_top_k_top_p_custom_tiling_plan.h
    if (TILING_KEY_IS(0)) {  // top-k and top-p
        op.Init(sorted_value, sorted_indices, p, k, out, t.batch, t.vocab, t.batchPerCore, t.tailBatch,
                t.chunkElements, t.tailChunkElements, t.iterateTimes, true, true);
        op.Process();
    } else if (TILING_KEY_IS(1)) {  // top-k only
        op.Init(sorted_value, sorted_indices, p, k, out, t.batch, t.vocab, t.batchPerCore, t.tailBatch,
                t.chunkElements, t.tailChunkElements, t.iterateTimes, true, false);
        op.Process();
    } else if (TILING_KEY_IS(2)) {  // top-p only
        op.Init(sorted_value, sorted_indices, p, k, out, t.batch, t.vocab, t.batchPerCore, t.tailBatch,
                t.chunkElements, t.tailChunkElements, t.iterateTimes, false, true);
        op.Process();
    } else if (TILING_KEY_IS(3)) {  // copy: V == 1, or neither filter
        op.Init(sorted_value, sorted_indices, p, k, out, t.batch, t.vocab, t.batchPerCore, t.tailBatch,
                t.chunkElements, t.tailChunkElements, t.iterateTimes, false, false);
        op.ProcessCopy();
    }
}
