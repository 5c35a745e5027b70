#include "rtp_llm/cpp/cpu/work_pool.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define RTP_PAUSE() _mm_pause()
#else
#define RTP_PAUSE() ((void)0)
#endif

namespace rtp_llm {
namespace {

using Fn = std::function<void(int64_t, int64_t)>;

// Chunks per thread: enough that a thread that stalls leaves most of its share to the others, few enough that
// claiming them (one atomic each) stays negligible.
constexpr int64_t kChunksPerThread = 2;
// An idle worker spins this long for the next loop before it sleeps: a step's loops come microseconds to tens of
// microseconds apart, and waking a sleeping thread costs several. Under contention (another process shares a
// core: an idle worker found itself descheduled for kStall) it spins kContendedSpin for the next kContendedFor: a spinning
// thread spends its share of the core on nothing and is then descheduled mid-chunk, where a sleeping one is woken
// with priority when work comes (benchmarks.run --hog).
using Clock = std::chrono::steady_clock;
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kContendedSpin = std::chrono::microseconds(20);
constexpr auto kStall = std::chrono::microseconds(500);
constexpr auto kContendedFor = std::chrono::seconds(1);
constexpr uint64_t kIndexMask = 0xffffffffull;
constexpr int64_t kMaxChunks = 256;  // beyond it (hundreds of threads) the last chunk takes the rest

thread_local bool t_in_pool = false;  // a chunk's own parallel_for runs inline
thread_local int t_inline = 0;        // depth of those inline loops (their chunks have no next one)
thread_local int t_slot = 0;          // 0: a caller; the i-th worker: i + 1

// parallel_for's chunk length for n items (the first chunks; the loop ends on smaller ones).
int64_t chunk_length(int64_t n, int64_t grain, int threads) {
    return std::max(grain, (n + threads * kChunksPerThread - 1) / (threads * kChunksPerThread));
}

class Pool {
  public:
    static Pool& instance() {
        static Pool* pool = new Pool();  // never destroyed: its workers may still be spinning at exit
        return *pool;
    }

    // false: another thread is using the pool (the caller then runs the loop itself).
    // bounds[0..chunks]: the chunks' edges, ascending.
    bool run(const int64_t* bounds, int64_t chunks, int workers, const Fn& fn) {
        std::unique_lock<std::mutex> running(run_mu_, std::try_to_lock);
        if (!running.owns_lock()) return false;
        grow(workers);
        // The last loop closed before its fields change: a worker still holding that loop's final claim word
        // could otherwise read this loop's larger chunk count, pass the bounds check and win the claim before the
        // new generation is published, running a chunk past the old loop's end (a chunk run twice, and run after
        // its caller returned). Closed, that claim word can no longer be won; and a worker that reads any field
        // below (release / acquire) also sees the close.
        claim_.store((gen_ << 32) | kIndexMask, std::memory_order_seq_cst);
        fn_.store(&fn, std::memory_order_release);
        for (int64_t i = 0; i <= chunks; ++i) bounds_[i].store(bounds[i], std::memory_order_release);
        chunks_.store(chunks, std::memory_order_release);
        workers_.store(workers, std::memory_order_release);
        done_.store(0, std::memory_order_release);
        error_ = nullptr;
        ++gen_;
        claim_.store(gen_ << 32, std::memory_order_seq_cst);  // publishes the fields above
        if (sleepers_.load(std::memory_order_seq_cst) > 0) {
            std::lock_guard<std::mutex> lk(mu_);
            cv_.notify_all();
        }
        t_in_pool = true;
        while (claim_and_run(claim_.load(std::memory_order_acquire))) {
        }
        t_in_pool = false;
        // Only chunks a worker has claimed are left: wait for those, not for workers that never came.
        while (done_.load(std::memory_order_acquire) < chunks) RTP_PAUSE();
        if (error_) std::rethrow_exception(error_);
        return true;
    }

    // Within a chunk of this pool's current loop, which is still running: its fields are this loop's.
    int64_t next_begin() const {
        const int64_t index = static_cast<int64_t>(claim_.load(std::memory_order_acquire) & kIndexMask);
        if (index >= chunks_.load(std::memory_order_acquire)) return -1;
        return bounds_[index].load(std::memory_order_acquire);
    }

  private:
    // Claims chunk `c`'s index if it is still this generation's next one, runs it; false when none is left.
    bool claim_and_run(uint64_t c) {
        const int64_t index = static_cast<int64_t>(c & kIndexMask);
        if (index >= chunks_.load(std::memory_order_acquire)) return false;
        const Fn* fn = fn_.load(std::memory_order_acquire);
        const int64_t b = bounds_[index].load(std::memory_order_acquire);
        const int64_t e = bounds_[index + 1].load(std::memory_order_acquire);
        // A newer loop, or another thread took this chunk: the fields read above may be stale, so nothing runs.
        if (!claim_.compare_exchange_strong(c, c + 1, std::memory_order_acq_rel)) return true;
        try {
            (*fn)(b, e);
        } catch (...) {
            std::lock_guard<std::mutex> lk(error_mu_);
            if (!error_) error_ = std::current_exception();
        }
        done_.fetch_add(1, std::memory_order_release);
        return true;
    }

    void grow(int workers) {
        while (static_cast<int>(threads_.size()) < workers) {
            const int id = static_cast<int>(threads_.size());
            threads_.emplace_back([this, id] { work(id); });
            threads_.back().detach();
        }
    }

    void work(int id) {
        t_in_pool = true;
        t_slot = id + 1;
        uint64_t c = claim_.load(std::memory_order_acquire);
        for (;;) {
            if (id < workers_.load(std::memory_order_relaxed) && claim_and_run(c)) {
                c = claim_.load(std::memory_order_acquire);
                continue;
            }
            wait_for_change(c);
            c = claim_.load(std::memory_order_acquire);
        }
    }

    void note_contention() {
        contended_until_.store((Clock::now() + kContendedFor).time_since_epoch().count(), std::memory_order_relaxed);
    }

    void wait_for_change(uint64_t c) {
        auto last = Clock::now();
        const auto start = last;
        const auto spin = last.time_since_epoch().count() < contended_until_.load(std::memory_order_relaxed)
                              ? kContendedSpin
                              : kSpin;
        for (int i = 0;; ++i) {
            if (claim_.load(std::memory_order_relaxed) != c) return;
            RTP_PAUSE();
            if ((i & 63) == 63) {
                const auto now = Clock::now();
                if (now - last > kStall) note_contention();  // this thread was descheduled in between
                if (now - start > spin) break;
                last = now;
            }
        }
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return claim_.load(std::memory_order_seq_cst) != c; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }

    std::atomic<uint64_t> claim_{0};  // generation << 32 | the next unclaimed chunk (kIndexMask: closed)
    std::atomic<const Fn*> fn_{nullptr};
    std::atomic<int64_t> bounds_[kMaxChunks + 1] = {}, chunks_{0}, done_{0};
    std::atomic<int> workers_{0}, sleepers_{0};
    std::atomic<Clock::rep> contended_until_{0};
    uint64_t gen_ = 0;
    std::exception_ptr error_;
    std::mutex error_mu_, mu_, run_mu_;
    std::condition_variable cv_;
    std::vector<std::thread> threads_;
};

void run_inline(const Fn& fn, int64_t begin, int64_t end) {
    struct Depth {
        Depth() { ++t_inline; }
        ~Depth() { --t_inline; }
    } depth;
    fn(begin, end);
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
    const int64_t n = end - begin;
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    // The thread count torch.set_num_threads sets (ATen on OpenMP reads the same setting).
    const int threads = t_in_pool ? 1 : omp_get_max_threads();
    if (threads <= 1 || n <= grain) return run_inline(fn, begin, end);
    // Equal chunks until two are left, then halves (at least `grain`): the loop ends on small pieces, so the thread
    // that finishes first waits for a small piece rather than a whole chunk, and only the tail pays extra claims.
    const int64_t chunk = chunk_length(n, grain, threads);
    int64_t bounds[kMaxChunks + 1];
    int64_t chunks = 0;
    bounds[0] = begin;
    for (int64_t left = n; left > 0; ++chunks) {
        const int64_t piece = left > 2 * chunk ? chunk : std::max(grain, (left + 1) / 2);
        const int64_t size = chunks + 1 == kMaxChunks ? left : std::min(left, piece);
        bounds[chunks + 1] = bounds[chunks] + size;
        left -= size;
    }
    if (chunks == 1 || !Pool::instance().run(bounds, chunks, threads - 1, fn)) run_inline(fn, begin, end);
}

int64_t parallel_for_next_begin() { return t_in_pool && t_inline == 0 ? Pool::instance().next_begin() : -1; }

int64_t parallel_for_first_begin(int64_t n, int64_t grain) {
    const int threads = omp_get_max_threads();
    const int64_t at = threads > 1 && n > grain ? t_slot * chunk_length(n, std::max<int64_t>(grain, 1), threads) : 0;
    return at < n ? at : -1;
}

}  // namespace rtp_llm
