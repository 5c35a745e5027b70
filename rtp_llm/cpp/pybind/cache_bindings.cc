// Python bindings of the cache core. Arrays cross the boundary through the buffer protocol
// (numpy arrays, or numpy views of CPU torch tensors): no per-element Python work, no copies.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "rtp_llm/cpp/cache/errors.h"
#include "rtp_llm/cpp/cache/kv_cache_manager.h"
#include "rtp_llm/cpp/pybind/bindings.h"

namespace py = pybind11;

namespace rtp_llm {
namespace {

// A C-contiguous 1-D (or any-D, flattened) buffer of exactly type T, checked with a message that
// names the argument.
template <typename T>
struct Array {
    T* data;
    int64_t size;
};

template <typename T>
Array<T> as_array(const py::buffer& obj, const char* name, bool writable) {
    py::buffer_info info = obj.request(writable);
    // numpy spells int64 'l' on LP64 and pybind11 'q': accept any signed integer code of the right size.
    std::string fmt = info.format;
    if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt = fmt.substr(1);
    const bool signed_int = fmt.size() == 1 && std::string("bhilq").find(fmt[0]) != std::string::npos;
    if (!signed_int || info.itemsize != static_cast<py::ssize_t>(sizeof(T))) {
        throw py::type_error(std::string(name) + " must be a buffer of " +
                             (sizeof(T) == 4 ? "int32" : "int64") + ", got format '" + info.format + "'");
    }
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
        if (info.shape[d] != 1 && info.strides[d] != expect) {
            throw py::value_error(std::string(name) + " must be C-contiguous");
        }
        expect *= info.shape[d];
    }
    return {static_cast<T*>(info.ptr), static_cast<int64_t>(info.size)};
}

py::list copies_to_list(const std::vector<BlockCopy>& copies) {
    py::list out;
    for (const auto& c : copies) out.append(py::make_tuple(c.src, c.dst));
    return out;
}

}  // namespace

void bind_cache(py::module_& m) {
    py::register_exception<OutOfBlocksError>(m, "OutOfBlocksError", PyExc_RuntimeError);
    py::register_exception<SequenceError>(m, "SequenceError", PyExc_ValueError);

    py::class_<CacheStats>(m, "CacheStats")
        .def_readonly("total_blocks", &CacheStats::total_blocks)
        .def_readonly("free_blocks", &CacheStats::free_blocks)
        .def_readonly("used_blocks", &CacheStats::used_blocks)
        .def_readonly("cached_blocks", &CacheStats::cached_blocks)
        .def_readonly("cache_entries", &CacheStats::cache_entries)
        .def_readonly("num_sequences", &CacheStats::num_sequences)
        .def_readonly("prefix_query_tokens", &CacheStats::prefix_query_tokens)
        .def_readonly("prefix_hit_tokens", &CacheStats::prefix_hit_tokens)
        .def_property_readonly("hit_rate", &CacheStats::hit_rate)
        .def("__repr__", [](const CacheStats& s) {
            return "CacheStats(total=" + std::to_string(s.total_blocks) + ", free=" + std::to_string(s.free_blocks) +
                   ", used=" + std::to_string(s.used_blocks) + ", cached=" + std::to_string(s.cached_blocks) +
                   ", sequences=" + std::to_string(s.num_sequences) + ")";
        });

    py::class_<KVCacheManager>(m, "KVCacheManager")
        .def(py::init<int32_t, int32_t, bool, int>(), py::arg("num_blocks"), py::arg("block_size"),
             py::arg("enable_prefix_cache") = true, py::arg("hash_bits") = 64)
        .def_property_readonly("block_size", &KVCacheManager::block_size)
        .def_property_readonly("num_blocks", &KVCacheManager::num_blocks)
        .def_property_readonly("prefix_cache_enabled", &KVCacheManager::prefix_cache_enabled)
        .def("match_prefix",
             [](const KVCacheManager& self, const py::buffer& tokens, uint64_t extra_key) {
                 auto t = as_array<int32_t>(tokens, "tokens", false);
                 return self.match_prefix(t.data, t.size, extra_key);
             },
             py::arg("tokens"), py::arg("extra_key") = 0)
        .def("can_allocate",
             [](const KVCacheManager& self, const py::buffer& tokens, int64_t total_slots, uint64_t extra_key) {
                 auto t = as_array<int32_t>(tokens, "tokens", false);
                 return self.can_allocate(t.data, t.size, total_slots, extra_key);
             },
             py::arg("tokens"), py::arg("total_slots"), py::arg("extra_key") = 0)
        .def("add_sequence",
             [](KVCacheManager& self, int64_t seq_id, const py::buffer& tokens, uint64_t extra_key,
                bool reuse_prefix) {
                 auto t = as_array<int32_t>(tokens, "tokens", false);
                 return self.add_sequence(seq_id, t.data, t.size, extra_key, reuse_prefix);
             },
             py::arg("seq_id"), py::arg("tokens"), py::arg("extra_key") = 0, py::arg("reuse_prefix") = true)
        .def("extend_tokens",
             [](KVCacheManager& self, int64_t seq_id, const py::buffer& tokens) {
                 auto t = as_array<int32_t>(tokens, "tokens", false);
                 self.extend_tokens(seq_id, t.data, t.size);
             },
             py::arg("seq_id"), py::arg("tokens"))
        .def("append_slots",
             [](KVCacheManager& self, int64_t seq_id, const py::buffer& slots_out) {
                 auto s = as_array<int32_t>(slots_out, "slots_out", true);
                 return copies_to_list(self.append_slots(seq_id, s.size, s.data));
             },
             py::arg("seq_id"), py::arg("slots_out"),
             "Slots for the next len(slots_out) known tokens, written into slots_out. Returns [(src, dst)] "
             "block copies (copy-on-write) to perform before this step's KV writes.")
        .def("append_decode",
             [](KVCacheManager& self, const py::buffer& seq_ids, const py::buffer& token_ids,
                const py::buffer& slots_out) {
                 auto ids = as_array<int64_t>(seq_ids, "seq_ids", false);
                 auto toks = as_array<int32_t>(token_ids, "token_ids", false);
                 auto s = as_array<int32_t>(slots_out, "slots_out", true);
                 if (toks.size != ids.size || s.size < ids.size) {
                     throw py::value_error("append_decode: seq_ids, token_ids and slots_out lengths differ");
                 }
                 return copies_to_list(self.append_decode(ids.data, ids.size, toks.data, s.data));
             },
             py::arg("seq_ids"), py::arg("token_ids"), py::arg("slots_out"))
        .def("append_speculative",
             [](KVCacheManager& self, int64_t seq_id, int32_t token, const py::buffer& drafts,
                const py::buffer& slots_out) {
                 auto d = as_array<int32_t>(drafts, "drafts", false);
                 auto s = as_array<int32_t>(slots_out, "slots_out", true);
                 if (s.size != d.size + 1) throw py::value_error("append_speculative: slots_out needs 1 + len(drafts)");
                 return copies_to_list(self.append_speculative(seq_id, token, d.data, d.size, s.data));
             },
             py::arg("seq_id"), py::arg("token"), py::arg("drafts"), py::arg("slots_out"),
             "The last sampled token and drafts after it, with slots; the drafts' blocks are cached only once "
             "truncate() keeps them. Returns copy-on-write block copies.")
        .def("truncate", &KVCacheManager::truncate, py::arg("seq_id"), py::arg("n"))
        .def("can_append", &KVCacheManager::can_append, py::arg("seq_id"), py::arg("n"))
        .def("blocks_needed", &KVCacheManager::blocks_needed, py::arg("seq_id"), py::arg("n"))
        .def("fork", &KVCacheManager::fork, py::arg("parent_id"), py::arg("child_id"))
        .def("free", &KVCacheManager::free, py::arg("seq_id"))
        .def("has_sequence", &KVCacheManager::has_sequence, py::arg("seq_id"))
        .def("num_slots", &KVCacheManager::num_slots, py::arg("seq_id"))
        .def("num_tokens", &KVCacheManager::num_tokens, py::arg("seq_id"))
        .def("block_table", &KVCacheManager::block_table, py::arg("seq_id"))
        .def("fill_block_tables",
             [](const KVCacheManager& self, const py::buffer& seq_ids, const py::buffer& out) {
                 auto ids = as_array<int64_t>(seq_ids, "seq_ids", false);
                 py::buffer_info info = out.request(true);
                 if (info.ndim != 2) throw py::value_error("fill_block_tables: out must be 2-D [batch, max_blocks]");
                 auto o = as_array<int32_t>(out, "out", true);
                 if (info.shape[0] < ids.size) throw py::value_error("fill_block_tables: out has fewer rows than seq_ids");
                 self.fill_block_tables(ids.data, ids.size, o.data, info.shape[1]);
             },
             py::arg("seq_ids"), py::arg("out"))
        .def("stats", &KVCacheManager::stats)
        .def("num_available_blocks", &KVCacheManager::num_available_blocks)
        .def("ref_count", &KVCacheManager::ref_count, py::arg("block"))
        .def("is_cached", &KVCacheManager::is_cached, py::arg("block"));
}

}  // namespace rtp_llm
