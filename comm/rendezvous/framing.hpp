// Length-prefixed JSON messages over a TCP socket, with deadlines: the rendezvous and the control
// plane's language (internal to comm/rendezvous).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace atl::framing {

using Clock = std::chrono::steady_clock;

// Throws std::runtime_error "control channel: <what> (<errno text>)", for a failed system call.
[[noreturn]] void fail(const std::string& what);
// The same without an errno text, for a failure no system call reported (a timeout, a bad message):
// errno then holds whatever an earlier call left.
[[noreturn]] void fail_plain(const std::string& what);
int remaining_ms(Clock::time_point deadline);
// "0.5", "120": a duration in seconds for messages.
std::string seconds_text(std::chrono::milliseconds t);
// Waits until fd is readable (POLLIN) or writable (POLLOUT); false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline);
// The largest message either side sends or takes (an address book of thousands of ranks fits).
constexpr std::uint32_t kMaxMessage = 64u << 20;
// A 4-byte big-endian length, then the JSON text (an object). Throws on a timeout, a broken
// connection, or a message longer than `max_bytes` (before reading it).
void send_message(int fd, const nlohmann::json& message, Clock::time_point deadline);
nlohmann::json receive_message(int fd, Clock::time_point deadline, std::uint32_t max_bytes = kMaxMessage);

}  // namespace atl::framing
