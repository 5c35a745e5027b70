// rtp_llm::parallel_for: the CPU kernels' parallel loop, without a join barrier.
//
// Why not at::parallel_for (OpenMP): it splits the range statically, one piece per thread, and every region ends
// at a barrier that waits for every thread. When a co-tenant takes a core, the thread on it is descheduled for
// whole time slices (milliseconds) and each of the step's hundreds of regions waits for it: the engine ran at a
// quarter of its speed while losing a quarter of the CPU. Here the range is cut into chunks (two per thread, the
// last two halved down to the grain so that threads finish close together), claimed one at a time from a shared
// counter by the caller and by the pool's workers; the caller returns once every chunk is done, waiting only for
// chunks a worker has started, never for a worker that has not shown up. So a thread that loses its core hands
// its share to the others; what it cannot hand over is a chunk it holds while descheduled.
//
// fn(b, e) gets disjoint ranges covering [begin, end), each at least `grain` long but the last; which thread runs
// a range varies from call to call, so a kernel's results must not depend on it (none here do: every output
// element is computed by one thread, in an order fixed by the element). Calls from inside a chunk run inline.
#pragma once

#include <cstdint>
#include <functional>

namespace rtp_llm {

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Inside a chunk of parallel_for: where the loop's next unclaimed chunk begins, the range this thread most likely
// runs next (-1: none left, or not in a pool chunk). A hint for prefetching only: another thread may claim it.
int64_t parallel_for_next_begin();

// Also a prefetch hint, for a chunk that has no next one: where this thread's first chunk of a coming
// parallel_for(0, n, grain) most likely begins (the caller claims the first chunk, the i-th worker the next).
int64_t parallel_for_first_begin(int64_t n, int64_t grain);

}  // namespace rtp_llm
