// Typed errors of the cache core. The Python binding maps each to its own exception class, so the
// scheduler can catch running out of blocks without parsing messages, and nothing ever abort()s.
#pragma once

#include <stdexcept>
#include <string>

namespace rtp_llm {

// Not enough free or evictable blocks for the request. Nothing was changed when this is thrown.
class OutOfBlocksError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// An unknown sequence id, a sequence added twice, or a call that does not fit the sequence's state.
class SequenceError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

}  // namespace rtp_llm
