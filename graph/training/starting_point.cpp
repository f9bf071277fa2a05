#include "graph/training/starting_point.hpp"

#include <cstdint>
#include <cstring>

namespace atl {

namespace {

using nlohmann::json;

constexpr const char* kSets[] = {"master", "exp_avg", "exp_avg_sq"};

const TensorMap& set_of(const TrainingState& s, int i) { return i == 0 ? s.master : i == 1 ? s.exp_avg : s.exp_avg_sq; }
TensorMap& set_of(TrainingState& s, int i) { return i == 0 ? s.master : i == 1 ? s.exp_avg : s.exp_avg_sq; }

// An 8-byte header length, the header, then the payload.
std::vector<std::byte> frame(const json& header, std::size_t payload_bytes) {
  const std::string text = header.dump();
  std::vector<std::byte> out(8 + text.size() + payload_bytes);
  const std::uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

}  // namespace

std::vector<std::byte> encode_starting_point(const StartingPoint& start) {
  json header = {{"step", start.state.step},
                 {"tokens", start.tokens},
                 {"description", start.description},
                 {"data_cursor", start.data_cursor ? *start.data_cursor : json()}};
  std::size_t payload = 0;
  for (int i = 0; i < 3; ++i) {
    json tensors = json::array();
    const TensorMap& set = set_of(start.state, i);
    for (const auto& name : set.names()) {
      const Tensor& t = set.at(name);
      if (t.dtype() != DType::f32) throw std::invalid_argument("starting point: '" + name + "' is not fp32");
      tensors.push_back({name, t.shape()});
      payload += t.bytes();
    }
    header[kSets[i]] = tensors;
  }
  std::vector<std::byte> out = frame(header, payload);
  std::byte* at = out.data() + (out.size() - payload);
  for (int i = 0; i < 3; ++i) {
    const TensorMap& set = set_of(start.state, i);
    for (const auto& name : set.names()) {
      const Tensor& t = set.at(name);
      std::memcpy(at, t.raw(), t.bytes());
      at += t.bytes();
    }
  }
  return out;
}

std::vector<std::byte> encode_start_failure(const std::string& why) { return frame(json{{"failed", why}}, 0); }

namespace {

std::invalid_argument malformed(const std::string& what) {
  return std::invalid_argument("starting point from node 0: " + what);
}

// The header, and where the payload begins.
std::pair<json, std::size_t> header_of(std::span<const std::byte> bytes) {
  std::uint64_t length = 0;
  if (bytes.size() < 8) throw malformed("shorter than its header length");
  std::memcpy(&length, bytes.data(), 8);
  if (length > bytes.size() - 8) throw malformed("header runs past the end");
  json header = json::parse(std::string(reinterpret_cast<const char*>(bytes.data()) + 8, length), nullptr, false);
  if (header.is_discarded() || !header.is_object()) throw malformed("header is not a JSON object");
  return {std::move(header), 8 + length};
}

StartingPoint decode_body(const json& header, std::span<const std::byte> bytes, std::size_t payload) {
  if (header.contains("failed")) throw StartFailed("node 0 could not start: " + header.at("failed").get<std::string>());
  StartingPoint start;
  start.state.step = header.at("step").get<std::int64_t>();
  start.tokens = header.at("tokens").get<std::int64_t>();
  start.description = header.at("description").get<std::string>();
  if (!header.at("data_cursor").is_null()) start.data_cursor = header.at("data_cursor");
  std::size_t at = payload;
  for (int i = 0; i < 3; ++i) {
    for (const auto& entry : header.at(kSets[i])) {
      const std::string name = entry.at(0).get<std::string>();
      Tensor t = Tensor::empty(entry.at(1).get<Shape>());
      if (t.bytes() > bytes.size() - at) throw malformed("tensor '" + name + "' runs past the end");
      std::memcpy(t.raw(), bytes.data() + at, t.bytes());
      at += t.bytes();
      set_of(start.state, i).insert(name, std::move(t));
    }
  }
  if (at != bytes.size()) throw malformed("bytes left over after the last tensor");
  return start;
}

}  // namespace

bool is_start_failure(std::span<const std::byte> bytes) {
  try {
    return header_of(bytes).first.contains("failed");
  } catch (const std::invalid_argument&) {
    return false;
  }
}

StartingPoint decode_starting_point(std::span<const std::byte> bytes) {
  const auto [header, payload] = header_of(bytes);
  try {
    return decode_body(header, bytes, payload);
  } catch (const nlohmann::json::exception& e) {  // a missing field or one of the wrong type
    throw malformed(std::string("header: ") + e.what());
  }
}

}  // namespace atl
