#include "graph/training/starting_point.hpp"

#include <cstdint>
#include <cstring>

#include "graph/checkpoint/json_file.hpp"

namespace atl {

namespace {

using nlohmann::json;

constexpr const char* kSets[] = {"master", "exp_avg", "exp_avg_sq"};

const TensorMap& set_of(const TrainingState& s, int i) { return i == 0 ? s.master : i == 1 ? s.exp_avg : s.exp_avg_sq; }
TensorMap& set_of(TrainingState& s, int i) { return i == 0 ? s.master : i == 1 ? s.exp_avg : s.exp_avg_sq; }

// An 8-byte length, then the header.
std::vector<std::byte> frame(const json& header) {
  const std::string text = header.dump();
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

}  // namespace

std::vector<std::byte> encode_start_header(const StartingPoint& start) {
  json header = {{"step", start.state.step},
                 {"tokens", start.tokens},
                 {"description", start.description},
                 {"data_cursor", start.data_cursor ? *start.data_cursor : json()}};
  for (int i = 0; i < 3; ++i) {
    json tensors = json::array();
    const TensorMap& set = set_of(start.state, i);
    for (const auto& name : set.names()) {
      const Tensor& t = set.at(name);
      if (t.dtype() != DType::f32) throw std::invalid_argument("starting point: '" + name + "' is not fp32");
      tensors.push_back({name, t.shape()});
    }
    header[kSets[i]] = tensors;
  }
  return frame(header);
}

std::vector<Tensor> start_tensors(const StartingPoint& start) {
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) {
    const TensorMap& set = set_of(start.state, i);
    for (const auto& name : set.names()) out.push_back(set.at(name));
  }
  return out;
}

std::vector<std::byte> encode_start_failure(const std::string& why, int exit_code) {
  return frame(json{{"failed", why}, {"exit_code", exit_code}});
}

namespace {

std::invalid_argument malformed(const std::string& what) {
  return std::invalid_argument("starting point from node 0: " + what);
}

json header_of(std::span<const std::byte> bytes) {
  std::uint64_t length = 0;
  if (bytes.size() < 8) throw malformed("shorter than its header length");
  std::memcpy(&length, bytes.data(), 8);
  if (length != bytes.size() - 8) throw malformed("header length " + std::to_string(length) + ", " +
                                                  std::to_string(bytes.size() - 8) + " bytes follow");
  json header;
  try {
    header = parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, length));
  } catch (const json::exception&) {  // malformed or nested too deep
    throw malformed("header is not a JSON object");
  }
  if (!header.is_object()) throw malformed("header is not a JSON object");
  return header;
}

StartingPoint decode_body(const json& header) {
  if (header.contains("failed")) {
    throw StartFailed("node 0 did not start: " + header.at("failed").get<std::string>(),
                      header.value("exit_code", 1));
  }
  StartingPoint start;
  start.state.step = header.at("step").get<std::int64_t>();
  start.tokens = header.at("tokens").get<std::int64_t>();
  start.description = header.at("description").get<std::string>();
  if (!header.at("data_cursor").is_null()) start.data_cursor = header.at("data_cursor");
  for (int i = 0; i < 3; ++i) {
    for (const auto& entry : header.at(kSets[i])) {
      set_of(start.state, i).insert(entry.at(0).get<std::string>(), Tensor::empty(entry.at(1).get<Shape>()));
    }
  }
  return start;
}

}  // namespace

bool is_start_failure(std::span<const std::byte> bytes) {
  try {
    return header_of(bytes).contains("failed");
  } catch (const std::invalid_argument&) {
    return false;
  }
}

StartingPoint decode_start_header(std::span<const std::byte> bytes) {
  const json header = header_of(bytes);
  try {
    return decode_body(header);
  } catch (const nlohmann::json::exception& e) {  // a missing field or one of the wrong type
    throw malformed(std::string("header: ") + e.what());
  }
}

}  // namespace atl
