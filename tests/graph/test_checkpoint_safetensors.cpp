// safetensors files: bitwise round trips of every dtype, the header layout of MODELS.md §10.5
// (padding, ordering, alignment, metadata), rejection of corrupt files with the file and fault
// named, and HF sharding with its index.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using namespace atl::checkpoint_testing;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// The message of the CheckpointError that reading `file` raises.
std::string read_error(const fs::path& file) {
  try {
    read_safetensors(file);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL("reading " << file << " raised no CheckpointError");
  return {};
}

std::string model_files_error(const fs::path& dir) {
  try {
    read_model_files(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL("reading the model files in " << dir << " raised no CheckpointError");
  return {};
}

// One tensor of each dtype (odd sizes, so alignment depends on the ordering), a scalar and an
// empty tensor, inserted in an order unlike the file order.
TensorMap mixed_tensors() {
  TensorMap m;
  m.insert("z.mask", random_tensor({3, 5}, DType::boolean, 1));
  m.insert("b.weight", random_tensor({3, 7}, DType::bf16, 2));
  m.insert("a.positions", random_tensor({5}, DType::i64, 3));
  m.insert("c.scale", random_tensor({}, DType::f32, 4));
  m.insert("d.ids", random_tensor({7}, DType::i32, 5));
  m.insert("e.empty", Tensor::empty({0, 4}, DType::f32));
  m.insert("f.weight", random_tensor({2, 3}, DType::f32, 6));
  m.insert("g.weight", random_tensor({3}, DType::bf16, 7));
  return m;
}

struct ParsedFile {
  std::uint64_t header_bytes = 0;
  std::string header_text;
  json header;
};

ParsedFile parse_file(const fs::path& file) {
  std::string bytes = read_bytes(file);
  ParsedFile p;
  for (int i = 0; i < 8; ++i) p.header_bytes |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  p.header_text = bytes.substr(8, p.header_bytes);
  p.header = json::parse(p.header_text);
  return p;
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bitwise, special values included", "[checkpoint][safetensors]") {
  TempDir tmp;
  TensorMap tensors = mixed_tensors();
  // Values that a conversion would disturb: NaN payloads, -0, infinities, denormals, extremes.
  Tensor special = Tensor::empty({6});
  float* f = special.data<float>();
  const std::uint32_t bits[6] = {0x7fc00001u, 0xffa00000u, 0x80000000u, 0x7f800000u, 0x00000001u, 0xff7fffffu};
  for (int i = 0; i < 6; ++i) std::memcpy(&f[i], &bits[i], 4);
  tensors.insert("special.f32", special);
  Tensor special_bf16 = Tensor::empty({4}, DType::bf16);
  const std::uint16_t bf[4] = {0x7fc1, 0x8000, 0xff80, 0x0001};
  std::memcpy(special_bf16.raw(), bf, sizeof bf);
  tensors.insert("special.bf16", special_bf16);
  Tensor extremes = Tensor::empty({2}, DType::i64);
  extremes.data<std::int64_t>()[0] = std::numeric_limits<std::int64_t>::min();
  extremes.data<std::int64_t>()[1] = std::numeric_limits<std::int64_t>::max();
  tensors.insert("special.i64", extremes);

  const fs::path file = tmp.path / "all.safetensors";
  write_safetensors(file, tensors);
  SafetensorsContents back = read_safetensors(file);

  REQUIRE(back.tensors.names().size() == tensors.names().size());
  for (const auto& name : tensors.names()) {
    INFO(name);
    REQUIRE(back.tensors.contains(name));
    CHECK(same_bits(back.tensors.at(name), tensors.at(name)));
  }
  // Documented order of the result: sorted by name.
  CHECK(std::is_sorted(back.tensors.names().begin(), back.tensors.names().end()));
  CHECK(back.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(std::isnan(back.tensors.at("special.f32").data<float>()[0]));
  CHECK(back.tensors.at("e.empty").shape() == Shape{0, 4});
  CHECK(back.tensors.at("c.scale").shape().empty());
  // No temporary file is left beside the result.
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors: header padding, ordering, alignment and metadata follow MODELS.md 10.5",
          "[checkpoint][safetensors]") {
  TempDir tmp;
  const fs::path file = tmp.path / "layout.safetensors";
  TensorMap tensors = mixed_tensors();
  write_safetensors(file, tensors);
  ParsedFile p = parse_file(file);

  CHECK(p.header_bytes % 8 == 0);
  // Padding is spaces after the JSON object, and the compact JSON itself has none at its end.
  std::size_t close = p.header_text.find_last_of('}');
  CHECK(p.header_text.find_first_not_of(' ', close + 1) == std::string::npos);
  CHECK(p.header_text.size() - close - 1 < 8);
  CHECK(p.header.at("__metadata__") == json{{"format", "pt"}});

  struct Placed {
    std::string name;
    std::size_t element = 0;
    std::uint64_t begin = 0, end = 0;
  };
  std::vector<Placed> placed;
  for (const auto& [name, entry] : p.header.items()) {
    if (name == "__metadata__") continue;
    const Tensor& t = tensors.at(name);
    CHECK(entry.at("dtype") == std::string(safetensors_dtype_name(t.dtype())));
    CHECK(entry.at("shape").get<Shape>() == t.shape());
    placed.push_back({name, element_size(t.dtype()), entry.at("data_offsets")[0], entry.at("data_offsets")[1]});
  }
  REQUIRE(placed.size() == tensors.names().size());
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < placed.size(); ++i) {
    INFO(placed[i].name);
    // Absolute offset in the file aligned to the element size.
    CHECK((8 + p.header_bytes + placed[i].begin) % placed[i].element == 0);
    CHECK(placed[i].begin == cursor);
    cursor = placed[i].end;
    if (i > 0) {
      // Ordered by (element size descending, name); the empty tensor sits at its own rank.
      bool ordered = placed[i - 1].element > placed[i].element ||
                     (placed[i - 1].element == placed[i].element && placed[i - 1].name < placed[i].name);
      CHECK(ordered);
    }
  }
  CHECK(8 + p.header_bytes + cursor == fs::file_size(file));
  CHECK(placed.front().name == "a.positions");  // the only 8-byte tensor
  CHECK(placed.back().name == "z.mask");        // the only 1-byte tensor

  // Other metadata round-trips; none at all writes no __metadata__ entry.
  write_safetensors(file, tensors, {{"format", "pt"}, {"step", "12"}});
  CHECK(read_safetensors(file).metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  write_safetensors(file, tensors, {});
  CHECK(!parse_file(file).header.contains("__metadata__"));
  CHECK(read_safetensors(file).metadata.empty());
}

TEST_CASE("safetensors: bool bytes are written as 0 or 1", "[checkpoint][safetensors]") {
  TempDir tmp;
  Tensor mask = Tensor::empty({4}, DType::boolean);
  const unsigned char raw[4] = {0, 1, 7, 255};  // non-canonical true values
  std::memcpy(mask.raw(), raw, 4);
  TensorMap m;
  m.insert("mask", mask);
  const fs::path file = tmp.path / "bool.safetensors";
  write_safetensors(file, m);
  std::string bytes = read_bytes(file);
  CHECK(bytes.substr(bytes.size() - 4) == std::string("\x00\x01\x01\x01", 4));
  Tensor back = read_safetensors(file).tensors.at("mask");
  const auto* b = static_cast<const unsigned char*>(back.raw());
  CHECK((b[0] == 0 && b[1] == 1 && b[2] == 1 && b[3] == 1));
}

TEST_CASE("safetensors: writing refuses a tensor called __metadata__", "[checkpoint][safetensors]") {
  TempDir tmp;
  TensorMap m;
  m.insert("__metadata__", Tensor::zeros({1}));
  CHECK_THROWS_AS(write_safetensors(tmp.path / "x.safetensors", m), CheckpointError);
  CHECK_THROWS_WITH(write_safetensors(tmp.path / "x.safetensors", m), Catch::Contains("may not be called __metadata__"));
  CHECK(!fs::exists(tmp.path / "x.safetensors"));
}

TEST_CASE("safetensors: a file truncated anywhere is rejected as truncated", "[checkpoint][safetensors]") {
  TempDir tmp;
  const fs::path good = tmp.path / "good.safetensors";
  write_safetensors(good, mixed_tensors());
  const std::string bytes = read_bytes(good);
  const std::uint64_t header_bytes = parse_file(good).header_bytes;
  const std::vector<std::size_t> cuts = {0, 3, 7, 8, 9, 8 + header_bytes / 2, 8 + header_bytes - 1, 8 + header_bytes,
                                         8 + header_bytes + 1, 8 + header_bytes + 8, bytes.size() - 1};
  for (std::size_t cut : cuts) {
    INFO("cut at byte " << cut << " of " << bytes.size());
    const fs::path file = tmp.path / ("cut" + std::to_string(cut) + ".safetensors");
    write_bytes(file, bytes.substr(0, cut));
    std::string message = read_error(file);
    CHECK_THAT(message, Contains(file.string()) && Contains("truncated"));
  }
}

TEST_CASE("safetensors: corrupt headers are rejected with the file and fault named", "[checkpoint][safetensors]") {
  TempDir tmp;
  const fs::path good = tmp.path / "good.safetensors";
  TensorMap m;
  m.insert("w", random_tensor({2, 2}, DType::f32, 9));
  write_safetensors(good, m);
  const std::string bytes = read_bytes(good);
  auto check = [&](const std::string& label, const std::string& file_bytes, const std::string& fault) {
    INFO(label);
    const fs::path file = tmp.path / (label + ".safetensors");
    write_bytes(file, file_bytes);
    CHECK_THAT(read_error(file), Contains(file.string()) && Contains(fault));
  };
  auto flip = [&](std::size_t at, char to) {
    std::string b = bytes;
    b[at] = to;
    return b;
  };

  // Header bytes flipped so that the JSON breaks.
  check("flip_open_brace", flip(8, '!'), "invalid JSON header");
  check("flip_colon", flip(8 + bytes.substr(8).find(':'), ';'), "invalid JSON header");
  check("flip_quote", flip(8 + bytes.substr(8).find('"'), '#'), "invalid JSON header");
  // A flipped high byte of the length makes it absurd.
  check("flip_length", flip(5, '\x01'), "absurd");
  check("missing", "", "truncated");

  const std::string data16(16, '\0');
  auto crafted = [&](const std::string& label, const std::string& header, const std::string& data,
                     const std::string& fault) {
    INFO(label << ": " << header);
    const fs::path file = tmp.path / (label + ".safetensors");
    write_raw_safetensors(file, header, data);
    CHECK_THAT(read_error(file), Contains(file.string()) && Contains(fault));
  };
  crafted("not_object", "[1, 2]    ", "", "not a JSON object");
  crafted("unknown_dtype", R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0'),
          "unknown dtype 'F16'");
  crafted("no_dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'), "dtype");
  crafted("negative_dim", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'),
          "bad shape");
  crafted("shape_not_array", R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", std::string(8, '\0'),
          "bad shape");
  crafted("fractional_dim", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, '\0'),
          "bad shape");
  crafted("huge_shape", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
          std::string(8, '\0'), "overflows");
  crafted("shape_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'),
          "shape mismatch");
  crafted("begin_after_end", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'),
          "data_offsets");
  crafted("one_offset", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", std::string(8, '\0'),
          "data_offsets");
  crafted("offsets_out_of_range", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'),
          "truncated data");
  crafted("overlap",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          std::string(12, '\0'), "overlapping tensors");
  crafted("same_offsets",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
          std::string(8, '\0'), "overlapping tensors");
  crafted("hole_between",
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          std::string(12, '\0'), "hole in the data buffer");
  crafted("hole_at_start", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'),
          "hole in the data buffer");
  crafted("hole_at_end", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data16, "hole in the data buffer");
  crafted("bad_bool", R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x00\x01\x02", 3),
          "BOOL element 2 has byte value 2");
  crafted("duplicate_name",
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          std::string(8, '\0'), "names 'a' twice");
  crafted("metadata_not_strings", R"({"__metadata__":{"format":1}})", "", "__metadata__");
  crafted("entry_not_object", R"({"a":[1]})", "", "not an object");
  // Nesting 200,000 deep in a 400 KB header: quoting it in the error overflowed the stack (SIGSEGV).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  crafted("deep_shape", R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", "",
          "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  crafted("deep_offsets", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":)" + deep + "}}", "",
          "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  // A length larger than the file but not absurd: truncation of the header.
  write_bytes(tmp.path / "long_length.safetensors", le64(4096) + "{}");
  CHECK_THAT(read_error(tmp.path / "long_length.safetensors"), Contains("long_length.safetensors") && Contains("truncated"));
  CHECK_THAT(read_error(tmp.path / "does_not_exist.safetensors"), Contains("does_not_exist") && Contains("cannot open"));

  // Controls: a crafted file that is valid reads, unaligned and unpadded as it is.
  write_raw_safetensors(tmp.path / "valid.safetensors",
                        R"({"m":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})",
                        std::string("\x01\x00\x00\x80\x3f", 5));
  SafetensorsContents valid = read_safetensors(tmp.path / "valid.safetensors");
  CHECK(valid.tensors.at("a").data<float>()[0] == 1.0f);
  CHECK(valid.metadata.empty());
}

TEST_CASE("safetensors: sharding with a tiny shard size writes shards and an index that read back identically",
          "[checkpoint][safetensors]") {
  TempDir tmp;
  TensorMap tensors;
  for (int i = 0; i < 9; ++i) tensors.insert("layers." + std::to_string(i) + ".w", random_f32({i + 1, 3}, 100 + i));
  tensors.insert("big", random_f32({40}, 7));  // 160 bytes: larger than a shard, gets its own
  tensors.insert("mask", random_tensor({5}, DType::boolean, 8));
  const std::int64_t max_shard = 64;
  const fs::path dir = tmp.path / "model";
  write_sharded_safetensors(dir, tensors, max_shard);

  const fs::path index_file = dir / "model.safetensors.index.json";
  REQUIRE(fs::exists(index_file));
  CHECK(!fs::exists(dir / "model.safetensors"));
  json index = json::parse(read_bytes(index_file));
  std::uint64_t total = 0;
  for (const auto& name : tensors.names()) total += tensors.at(name).bytes();
  CHECK(index.at("metadata").at("total_size") == total);
  CHECK(index.at("weight_map").size() == tensors.names().size());

  std::set<std::string> files;
  for (const auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
  const int count = static_cast<int>(files.size());
  // Filled in insertion order until the next tensor would pass 64 bytes, by hand: layers.0 + layers.1
  // (12 + 24 bytes); layers.2 (36: 36 + 48 would pass); layers.3 (48); layers.4 (60); layers.5 to
  // layers.8 and big each alone (72..160, over the limit); mask (5 bytes, after big's 160).
  CHECK(count == 10);
  const std::vector<std::pair<std::string, int>> expected_shard = {
      {"layers.0.w", 1}, {"layers.1.w", 1}, {"layers.2.w", 2}, {"layers.3.w", 3}, {"layers.4.w", 4}, {"layers.5.w", 5},
      {"layers.6.w", 6}, {"layers.7.w", 7}, {"layers.8.w", 8}, {"big", 9},         {"mask", 10}};
  for (const auto& [name, shard] : expected_shard) {
    INFO(name);
    CHECK(index.at("weight_map").at(name) == shard_file_name(shard, 10));
  }
  for (int i = 1; i <= count; ++i) {
    std::string name = shard_file_name(i, count);
    INFO(name);
    CHECK(files.count(name) == 1);
    SafetensorsContents shard = read_safetensors(dir / name);
    std::uint64_t bytes = 0;
    for (const auto& t : shard.tensors.names()) bytes += shard.tensors.at(t).bytes();
    CHECK((bytes <= static_cast<std::uint64_t>(max_shard) || shard.tensors.names().size() == 1));
    CHECK(shard.metadata.at("format") == "pt");
  }
  CHECK(shard_file_name(2, 5) == "model-00002-of-00005.safetensors");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == count + 1);

  SafetensorsContents back = read_model_files(dir);
  CHECK(same_tensors(back.tensors, tensors));
  CHECK(std::is_sorted(back.tensors.names().begin(), back.tensors.names().end()));
  CHECK(back.metadata.at("format") == "pt");

  // Rewriting the same directory as one file removes the shards and the index.
  write_sharded_safetensors(dir, tensors, std::int64_t{1} << 30);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  CHECK(same_tensors(read_model_files(dir).tensors, tensors));
}

TEST_CASE("safetensors: index faults are rejected with the file and fault named", "[checkpoint][safetensors]") {
  TempDir tmp;
  TensorMap tensors;
  for (int i = 0; i < 4; ++i) tensors.insert(std::string("t").append(std::to_string(i)), random_f32({4}, 50 + i));  // 16 bytes each
  auto fresh = [&](const std::string& label) {
    fs::path dir = tmp.path / label;
    write_sharded_safetensors(dir, tensors, 32);  // two tensors a shard: two shards
    return dir;
  };
  auto edit_index = [](const fs::path& dir, auto&& change) {
    fs::path file = dir / "model.safetensors.index.json";
    json index = json::parse(read_bytes(file));
    change(index);
    write_bytes(file, index.dump());
  };
  const std::string index_name = "model.safetensors.index.json";

  fs::path ok = fresh("ok");
  REQUIRE(fs::exists(ok / shard_file_name(2, 2)));
  CHECK(same_tensors(read_model_files(ok).tensors, tensors));

  fs::path missing_shard = fresh("missing_shard");
  fs::remove(missing_shard / shard_file_name(2, 2));
  CHECK_THAT(model_files_error(missing_shard),
             Contains((missing_shard / index_name).string()) && Contains("missing shard file") &&
                 Contains(shard_file_name(2, 2)));

  fs::path unmapped = fresh("unmapped");
  edit_index(unmapped, [](json& j) { j["weight_map"].erase("t3"); });
  CHECK_THAT(model_files_error(unmapped), Contains(index_name) && Contains("'t3'") && Contains("missing from weight_map"));

  fs::path misplaced = fresh("misplaced");
  edit_index(misplaced, [](json& j) { j["weight_map"]["t0"] = shard_file_name(2, 2); });
  CHECK_THAT(model_files_error(misplaced), Contains(index_name) && Contains("'t0'") && Contains("places it in"));

  fs::path phantom = fresh("phantom");
  edit_index(phantom, [](json& j) { j["weight_map"]["t9"] = shard_file_name(1, 2); });
  CHECK_THAT(model_files_error(phantom), Contains(index_name) && Contains("'t9' is missing"));

  fs::path wrong_total = fresh("wrong_total");
  edit_index(wrong_total, [](json& j) { j["metadata"]["total_size"] = 65; });
  CHECK_THAT(model_files_error(wrong_total), Contains(index_name) && Contains("total_size is 65") && Contains("64"));

  // Both tensors of the second shard dropped from weight_map: that shard is never read.
  fs::path unread_shard = fresh("unread_shard");
  edit_index(unread_shard, [](json& j) {
    j["weight_map"].erase("t2");
    j["weight_map"].erase("t3");
  });
  CHECK_THAT(model_files_error(unread_shard),
             Contains("total_size is 64 but the shards hold 32 bytes of tensors (weight_map names no tensor of '" +
                      shard_file_name(2, 2) + "' in this folder: are its tensors missing from weight_map?)"));

  fs::path no_total = fresh("no_total");
  edit_index(no_total, [](json& j) { j.erase("metadata"); });
  CHECK_THAT(model_files_error(no_total), Contains(index_name) && Contains("total_size"));

  fs::path escaping = fresh("escaping");
  edit_index(escaping, [](json& j) { j["weight_map"]["t0"] = std::string("../ok/").append(shard_file_name(1, 2)); });
  CHECK_THAT(model_files_error(escaping), Contains(index_name) && Contains("not a file in this directory"));

  fs::path bad_json = fresh("bad_json");
  write_bytes(bad_json / index_name, "{\"weight_map\": ");
  CHECK_THAT(model_files_error(bad_json), Contains(index_name) && Contains("invalid JSON"));

  // A corrupt shard is reported under the shard's own name.
  fs::path corrupt_shard = fresh("corrupt_shard");
  fs::resize_file(corrupt_shard / shard_file_name(1, 2), 20);
  CHECK_THAT(model_files_error(corrupt_shard), Contains(shard_file_name(1, 2)) && Contains("truncated"));

  fs::path empty = tmp.path / "empty";
  fs::create_directories(empty);
  CHECK_THAT(model_files_error(empty), Contains(empty.string()) && Contains("no model.safetensors"));
}

// A FIFO where a safetensors file is expected (a shard an index names, say) is refused at once:
// opening it for reading would otherwise wait for a writer forever.
TEST_CASE("safetensors: a FIFO is refused as not a regular file, not waited on", "[checkpoint][safetensors]") {
  TempDir tmp;
  const fs::path fifo = tmp.path / "model.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(read_safetensors(fifo), Catch::Contains(fifo.string()) && Catch::Contains("not a regular file"));
}
