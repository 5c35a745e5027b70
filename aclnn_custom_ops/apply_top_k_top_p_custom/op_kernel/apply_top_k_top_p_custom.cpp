// AscendC kernel of ApplyTopKTopPCustom. Same per-row walk as op_host/apply_top_k_top_p_custom_reference.h
// (which the host gtest checks against the documented algorithm):
//   out row := -inf;  threshold = sorted[V - k] (ties kept);  max = sorted[V - 1];
//   pass 1: total = sum over survivors of exp(x - max), chunk by chunk (vector Exp + ReduceSum);
//   pass 2: cumulative sum of exp(x - max) / total with a carry across chunks; a survivor is kept when
//           the sum passes 1 - p (the largest always); kept values are written to out[row, index].
// Rows are split over cores by the tiling; chunks are double-buffered (copy-in overlaps compute).
// The cumulative sum and the scatter are scalar loops here: correct first; AscendC::CumSum (CANN >= 8.0.RC3)
// and a gathered write are the next step for speed. Compiled by bisheng on a CANN machine only.
#include "kernel_operator.h"

using namespace AscendC;

namespace {
constexpr int32_t BUFFER_NUM = 2;

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
    }

    __aicore__ inline void Process() {
        for (uint32_t r = 0; r < rows_; ++r) Row(firstRow_ + r);
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

    // exp(x - max) for survivors, 0 for values below the threshold, into expBuf_ (float).
    __aicore__ inline void ExpChunk(LocalTensor<T>& v, uint32_t n, float mx, float threshold) {
        LocalTensor<float> e = expBuf_.Get<float>();
        if constexpr (IsSameType<T, float>::value) {
            DataCopy(e, v, (n + 7) / 8 * 8);
        } else {
            Cast(e, v, RoundMode::CAST_NONE, n);
        }
        PipeBarrier<PIPE_V>();
        for (uint32_t i = 0; i < n; ++i) {  // below-threshold -> -inf so exp gives 0
            if (e.GetValue(i) < threshold) e.SetValue(i, -3.0e38f);
        }
        Adds(e, e, -mx, n);
        PipeBarrier<PIPE_V>();
        Exp(e, e, n);
        PipeBarrier<PIPE_V>();
    }

    __aicore__ inline void Row(uint32_t row) {
        const uint64_t base = static_cast<uint64_t>(row) * vocab_;
        // the output row starts as -inf
        LocalTensor<T> fill = fillBuf_.Get<T>();
        Duplicate(fill, static_cast<T>(-INFINITY), chunk_);
        PipeBarrier<PIPE_ALL>();
        for (uint32_t c = 0; c < iterate_; ++c) {
            DataCopyPad(outGm_[base + static_cast<uint64_t>(c) * chunk_], fill,
                        DataCopyExtParams{1, static_cast<uint32_t>(Len(c) * sizeof(T)), 0, 0, 0});
        }
        PipeBarrier<PIPE_ALL>();
        int32_t k = useK_ ? kGm_.GetValue(row) : static_cast<int32_t>(vocab_);
        if (k < 1) k = 1;
        if (static_cast<uint32_t>(k) > vocab_) k = static_cast<int32_t>(vocab_);
        const float threshold = ToFloat(sortedGm_.GetValue(base + vocab_ - k));
        const float mx = ToFloat(sortedGm_.GetValue(base + vocab_ - 1));
        const float p = useP_ ? ToFloat(pGm_.GetValue(row)) : 1.0f;

        float total = 0.f;  // pass 1
        for (uint32_t c = 0; c < iterate_; ++c) {
            const uint32_t n = Len(c);
            CopyIn(base + static_cast<uint64_t>(c) * chunk_, n, false);
            LocalTensor<T> v = valueQue_.DeQue<T>();
            ExpChunk(v, n, mx, threshold);
            LocalTensor<float> e = expBuf_.Get<float>();
            LocalTensor<float> red = reduceBuf_.Get<float>();
            ReduceSum(red, e, red, n);
            event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
            SetFlag<HardEvent::V_S>(ev);
            WaitFlag<HardEvent::V_S>(ev);
            total += red.GetValue(0);
            valueQue_.FreeTensor(v);
        }
        const float inv = 1.f / total;

        float carry = 0.f;  // pass 2
        for (uint32_t c = 0; c < iterate_; ++c) {
            const uint32_t n = Len(c);
            const uint64_t chunkBase = base + static_cast<uint64_t>(c) * chunk_;
            CopyIn(chunkBase, n, true);
            LocalTensor<T> v = valueQue_.DeQue<T>();
            LocalTensor<int32_t> idx = indexQue_.DeQue<int32_t>();
            ExpChunk(v, n, mx, threshold);
            LocalTensor<float> e = expBuf_.Get<float>();
            Muls(e, e, inv, n);
            event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
            SetFlag<HardEvent::V_S>(ev);
            WaitFlag<HardEvent::V_S>(ev);
            for (uint32_t i = 0; i < n; ++i) {
                const T x = v.GetValue(i);
                if (ToFloat(x) < threshold) continue;
                carry += e.GetValue(i);
                const bool last = c + 1 == iterate_ && i + 1 == n;
                if (!useP_ || last || carry > 1.f - p) {
                    outGm_.SetValue(base + static_cast<uint64_t>(idx.GetValue(i)), x);
                }
            }
            valueQue_.FreeTensor(v);
            indexQue_.FreeTensor(idx);
        }
    }

    TPipe pipe_;
    TQue<QuePosition::VECIN, BUFFER_NUM> valueQue_, indexQue_;
    TBuf<TPosition::VECCALC> fillBuf_, expBuf_, reduceBuf_;
    GlobalTensor<T> sortedGm_, outGm_, pGm_;
    GlobalTensor<int32_t> indicesGm_, kGm_;
    uint32_t vocab_ = 0, chunk_ = 0, tailChunk_ = 0, iterate_ = 0, firstRow_ = 0, rows_ = 0;
    bool useK_ = false, useP_ = false;
};
}  // namespace

extern "C" __global__ __aicore__ void apply_top_k_top_p_custom(GM_ADDR sorted_value, GM_ADDR sorted_indices,
                                                               GM_ADDR p, GM_ADDR k, GM_ADDR out, GM_ADDR workspace,
                                                               GM_ADDR tiling) {
    GET_TILING_DATA(t, tiling);
    ApplyTopKTopP<DTYPE_SORTED_VALUE> op;
    // tiling keys: 0 top-k + top-p, 1 top-k only, 2 top-p only, 3 copy (V == 1 or neither)
    const bool useK = TILING_KEY_IS(0) || TILING_KEY_IS(1);
    const bool useP = TILING_KEY_IS(0) || TILING_KEY_IS(2);
    op.Init(sorted_value, sorted_indices, p, k, out, t.batch, t.vocab, t.batchPerCore, t.tailBatch, t.chunkElements,
            t.tailChunkElements, t.iterateTimes, useK, useP);
    op.Process();
}
