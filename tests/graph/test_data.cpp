// Data sources: packing rules, cursors, determinism, the synthetic corpus's entropy, file formats.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "graph/data/data_source.hpp"
#include "graph/data/file_sources.hpp"
#include "graph/data/synthetic_source.hpp"

using namespace atl;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("atoll_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::string file = (path / name).string();
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file;
  }
};

std::vector<std::int64_t> values(const Tensor& t) {
  std::vector<std::int64_t> v;
  if (t.dtype() == DType::boolean) {
    for (bool b : t.span<bool>()) v.push_back(b);
  } else {
    for (std::int64_t x : t.span<std::int64_t>()) v.push_back(x);
  }
  return v;
}
std::vector<std::int64_t> row(const Tensor& t, std::int64_t r) { return values(t.slice_rows(r, r + 1)); }

bool same_batch(const Batch& a, const Batch& b) {
  return values(a.input_ids) == values(b.input_ids) && values(a.positions) == values(b.positions) &&
         values(a.valid) == values(b.valid) && values(a.targets) == values(b.targets);
}

std::string little_endian(const std::vector<std::uint32_t>& tokens, int width) {
  std::string bytes;
  for (std::uint32_t t : tokens) {
    for (int k = 0; k < width; ++k) bytes.push_back(static_cast<char>((t >> (8 * k)) & 0xFF));
  }
  return bytes;
}

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

constexpr std::int64_t X = kIgnoreTarget;

}  // namespace

TEST_CASE("packing: targets, positions and the row overlap follow the documents", "[data]") {
  DocumentListSource source({{10, 11, 12}, {20, 21}, {30, 31, 32, 33}});
  Batch b = source.next(3, 4);
  REQUIRE(b.rows() == 3);
  REQUIRE(b.seq_len() == 4);
  // Stream: 10 11 12 | 20 21 | 30 31 32 33 | 10 11 12 | 20 ...; row r starts at stream token 4r.
  CHECK(row(b.input_ids, 0) == std::vector<std::int64_t>{10, 11, 12, 20});
  CHECK(row(b.positions, 0) == std::vector<std::int64_t>{0, 1, 2, 0});
  CHECK(row(b.targets, 0) == std::vector<std::int64_t>{11, 12, X, 21});
  // Row 1 starts at row 0's last target token (21), inside document 2: position 1 at column 0.
  CHECK(row(b.input_ids, 1) == std::vector<std::int64_t>{21, 30, 31, 32});
  CHECK(row(b.positions, 1) == std::vector<std::int64_t>{1, 0, 1, 2});
  CHECK(row(b.targets, 1) == std::vector<std::int64_t>{X, 31, 32, 33});
  // Row 2 crosses the epoch boundary: the list starts again as a new document.
  CHECK(row(b.input_ids, 2) == std::vector<std::int64_t>{33, 10, 11, 12});
  CHECK(row(b.positions, 2) == std::vector<std::int64_t>{3, 0, 1, 2});
  CHECK(row(b.targets, 2) == std::vector<std::int64_t>{X, 11, 12, X});
  CHECK(values(b.valid) == std::vector<std::int64_t>(12, 1));
  CHECK(b.target_count() == 8);
  CHECK(b.valid_count() == 12);
  CHECK(source.cursor()["epoch"] == 1);
}

TEST_CASE("Batch::slice_rows shares storage and counts targets of its rows", "[data]") {
  DocumentListSource source({{1, 2, 3, 4, 5, 6, 7}});
  Batch b = source.next(2, 3);
  Batch second = b.slice_rows(1, 2);
  REQUIRE(second.rows() == 1);
  CHECK(row(second.input_ids, 0) == std::vector<std::int64_t>{4, 5, 6});
  CHECK(row(second.targets, 0) == std::vector<std::int64_t>{5, 6, 7});
  second.input_ids.data<std::int64_t>()[0] = 99;
  CHECK(b.input_ids.data<std::int64_t>()[3] == 99);
  CHECK(second.target_count() == 3);
  CHECK(b.target_count() == 6);
}

TEST_CASE("text source: blank lines separate documents, a non-looping file pads after its end", "[data]") {
  TempDir dir;
  // Documents: "ab\ncd" (a single newline is a token), "xy", "z"; "\n\n" and "\n\n\n" are separators.
  std::string path = dir.write("tiny.txt", "ab\ncd\n\nxy\n\n\nz");
  TextFileSource source(path, 250, /*loop=*/false);
  Batch b = source.next(4, 3);
  const std::int64_t a = 'a', bb = 'b', nl = '\n', c = 'c', d = 'd', x = 'x', y = 'y', z = 'z';
  CHECK(row(b.input_ids, 0) == std::vector<std::int64_t>{a, bb, nl});
  CHECK(row(b.positions, 0) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(row(b.targets, 0) == std::vector<std::int64_t>{bb, nl, c});
  // Document 1 spans rows 0 and 1.
  CHECK(row(b.input_ids, 1) == std::vector<std::int64_t>{c, d, x});
  CHECK(row(b.positions, 1) == std::vector<std::int64_t>{3, 4, 0});
  CHECK(row(b.targets, 1) == std::vector<std::int64_t>{d, X, y});
  // The file ends after 'z'; padding is input 0, invalid, unscored, and its own document.
  CHECK(row(b.input_ids, 2) == std::vector<std::int64_t>{y, z, 0});
  CHECK(row(b.positions, 2) == std::vector<std::int64_t>{1, 0, 0});
  CHECK(row(b.valid, 2) == std::vector<std::int64_t>{1, 1, 0});
  CHECK(row(b.targets, 2) == std::vector<std::int64_t>{X, X, X});
  CHECK(row(b.input_ids, 3) == std::vector<std::int64_t>{0, 0, 0});
  CHECK(row(b.positions, 3) == std::vector<std::int64_t>{1, 2, 3});
  CHECK(row(b.valid, 3) == std::vector<std::int64_t>{0, 0, 0});
  CHECK(row(b.targets, 3) == std::vector<std::int64_t>{X, X, X});
  CHECK(source.exhausted());
  CHECK(b.target_count() == 5);

  // Padding continues across a cursor restore.
  TextFileSource resumed(path, 250, false);
  resumed.restore(source.cursor());
  Batch more = resumed.next(1, 2);
  CHECK(row(more.positions, 0) == std::vector<std::int64_t>{4, 5});
  CHECK(same_batch(more, source.next(1, 2)));
}

TEST_CASE("text source: looping starts a new epoch with a new document", "[data]") {
  TempDir dir;
  std::string path = dir.write("loop.txt", "\n\nab\n\ncd\n");  // leading blank line dropped; "cd\n" keeps its newline
  TextFileSource source(path, 250);
  Batch b = source.next(1, 7);
  CHECK(values(b.input_ids) == std::vector<std::int64_t>{'a', 'b', 'c', 'd', '\n', 'a', 'b'});
  CHECK(values(b.positions) == std::vector<std::int64_t>{0, 1, 0, 1, 2, 0, 1});
  CHECK(values(b.targets) == std::vector<std::int64_t>{'b', X, 'd', '\n', X, 'b', X});
  CHECK(source.cursor()["epoch"] == 1);
  CHECK(source.cursor()["offset"] == 6);  // the 'c' that row 0's last target pointed at
}

TEST_CASE("synthetic source: same seed gives the same batches, another seed other batches", "[data]") {
  SyntheticSource a(7, 250), b(7, 250), c(8, 250);
  for (int i = 0; i < 3; ++i) {
    Batch x = a.next(2, 32), y = b.next(2, 32), z = c.next(2, 32);
    CHECK(same_batch(x, y));
    CHECK_FALSE(same_batch(x, z));
  }
}

TEST_CASE("cursor restore mid-document gives the identical next batches", "[data]") {
  TempDir dir;
  std::string text;
  for (int d = 0; d < 9; ++d) text += std::string(static_cast<std::size_t>(5 + d * 3), static_cast<char>('a' + d)) + "\n\n";
  std::string text_path = dir.write("docs.txt", text);
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 100; ++i) tokens.push_back(i % 11 == 10 ? 0 : 1 + i % 7);
  std::string token_path = dir.write("docs.u16", little_endian(tokens, 2));

  auto check = [](auto make) {
    auto source = make();
    source->next(3, 7);
    // Take single tokens until the last one had a scored target: the cursor is then mid-document.
    while (source->next(1, 1).targets.template data<std::int64_t>()[0] == kIgnoreTarget) {
    }
    nlohmann::json cursor = source->cursor();
    Batch expected1 = source->next(2, 5);
    Batch expected2 = source->next(1, 9);
    auto resumed = make();
    resumed->restore(cursor);
    Batch got1 = resumed->next(2, 5);
    CHECK(got1.positions.template data<std::int64_t>()[0] > 0);
    CHECK(same_batch(got1, expected1));
    CHECK(same_batch(resumed->next(1, 9), expected2));
    CHECK(resumed->cursor() == source->cursor());
  };
  SECTION("synthetic") {
    check([] { return std::make_unique<SyntheticSource>(3, 250, SyntheticOptions{4, 8, 16}); });
  }
  SECTION("text") { check([&] { return std::make_unique<TextFileSource>(text_path, 250); }); }
  SECTION("tokens") {
    check([&] { return std::make_unique<TokenFileSource>(token_path, 250, 0, std::int64_t{0}); });
  }
}

TEST_CASE("a restored cursor inside a document keeps its positions", "[data]") {
  SyntheticSource source(11, 250, SyntheticOptions{4, 20, 20});
  source.next(1, 7);  // document 0 has 20 tokens: the cursor is now at offset 7
  nlohmann::json cursor = source.cursor();
  CHECK(cursor["document"] == 0);
  CHECK(cursor["offset"] == 7);
  SyntheticSource resumed(11, 250, SyntheticOptions{4, 20, 20});
  resumed.restore(cursor);
  Batch b = resumed.next(1, 4);
  CHECK(values(b.positions) == std::vector<std::int64_t>{7, 8, 9, 10});
  std::vector<std::int64_t> doc = source.document(0);
  CHECK(values(b.input_ids) == std::vector<std::int64_t>(doc.begin() + 7, doc.begin() + 11));
  CHECK(values(b.targets) == std::vector<std::int64_t>(doc.begin() + 8, doc.begin() + 12));
}

TEST_CASE("synthetic source: entropy floor is H(profile) and the empirical transition entropy matches", "[data]") {
  // Profile for branching 4: proportional to 1, 1/2, 1/3, 1/4 -> 12/25, 6/25, 4/25, 3/25.
  const double expected_h = -(0.48 * std::log(0.48) + 0.24 * std::log(0.24) + 0.16 * std::log(0.16) +
                              0.12 * std::log(0.12));
  CHECK(expected_h == Approx(1.242453).margin(1e-6));
  const std::int64_t vocab = 50;
  SyntheticSource source(5, vocab);
  REQUIRE(source.entropy_nats_per_token().has_value());
  CHECK(*source.entropy_nats_per_token() == Approx(expected_h).epsilon(1e-12));
  CHECK(source.profile()[0] == Approx(0.48).epsilon(1e-12));
  CHECK(source.profile()[3] == Approx(0.12).epsilon(1e-12));

  // Successors are distinct ids in the vocab.
  for (std::int64_t v = 0; v < vocab; ++v) {
    std::vector<std::int64_t> s = source.successors(v);
    REQUIRE(s.size() == 4);
    for (std::size_t i = 0; i < s.size(); ++i) {
      CHECK((s[i] >= 0 && s[i] < vocab));
      for (std::size_t j = 0; j < i; ++j) CHECK(s[i] != s[j]);
    }
  }

  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> pair_counts;
  std::vector<std::int64_t> from_counts(static_cast<std::size_t>(vocab), 0);
  double model_nll = 0.0;
  std::int64_t scored = 0, not_a_successor = 0, wrongly_ignored = 0;
  for (int step = 0; step < 50; ++step) {
    Batch b = source.next(16, 256);
    const auto ids = b.input_ids.span<std::int64_t>();
    const auto targets = b.targets.span<std::int64_t>();
    const auto positions = b.positions.span<std::int64_t>();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (targets[i] == kIgnoreTarget) {
        // Unscored only at a document's last token: the next in-row token starts a document.
        if ((i + 1) % 256 != 0 && positions[i + 1] != 0) ++wrongly_ignored;
        continue;
      }
      std::vector<std::int64_t> s = source.successors(ids[i]);
      auto it = std::find(s.begin(), s.end(), targets[i]);
      if (it == s.end()) {
        ++not_a_successor;
        continue;
      }
      model_nll -= std::log(source.profile()[static_cast<std::size_t>(it - s.begin())]);
      ++pair_counts[{ids[i], targets[i]}];
      ++from_counts[static_cast<std::size_t>(ids[i])];
      ++scored;
    }
  }
  CHECK(not_a_successor == 0);
  CHECK(wrongly_ignored == 0);
  REQUIRE(scored > 150000);
  // Mean -log p(target | input) under the true chain: each term has std ~0.6 nats, so ~0.002 here.
  CHECK(model_nll / static_cast<double>(scored) == Approx(expected_h).margin(0.01));
  // Plug-in conditional entropy of the observed transitions (bias ~ -3/(2 * 3000 per state)).
  double h = 0.0;
  for (const auto& [pair, n] : pair_counts) {
    const double p_pair = static_cast<double>(n) / static_cast<double>(scored);
    const double p_next = static_cast<double>(n) / static_cast<double>(from_counts[static_cast<std::size_t>(pair.first)]);
    h -= p_pair * std::log(p_next);
  }
  CHECK(h == Approx(expected_h).margin(0.01));
}

TEST_CASE("token files: memory-mapped uint16 and uint32 with eos documents", "[data]") {
  TempDir dir;
  SECTION("uint16 from the extension, eos ends documents") {
    std::string path = dir.write("a.u16", little_endian({5, 6, 0, 7, 8, 9, 0, 300}, 2));
    TokenFileSource source(path, 1000, 0, std::int64_t{0});
    CHECK(source.width() == 2);
    CHECK(source.token_count() == 8);
    Batch b = source.next(1, 8);
    CHECK(values(b.input_ids) == std::vector<std::int64_t>{5, 6, 0, 7, 8, 9, 0, 300});
    CHECK(values(b.positions) == std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 3, 0});
    // The eos token is its document's last token; the wrap to epoch 1 starts a document too.
    CHECK(values(b.targets) == std::vector<std::int64_t>{6, 0, X, 8, 9, 0, X, X});
  }
  SECTION("uint32 with ids above 65535, width given for a .bin file, no eos: one document per epoch") {
    std::string path = dir.write("b.bin", little_endian({70000, 1, 65536, 2}, 4));
    TokenFileSource source(path, 100000, 4, std::nullopt, /*loop=*/false);
    Batch b = source.next(2, 3);
    CHECK(row(b.input_ids, 0) == std::vector<std::int64_t>{70000, 1, 65536});
    CHECK(row(b.targets, 0) == std::vector<std::int64_t>{1, 65536, 2});
    CHECK(row(b.input_ids, 1) == std::vector<std::int64_t>{2, 0, 0});
    CHECK(row(b.positions, 1) == std::vector<std::int64_t>{3, 0, 1});
    CHECK(row(b.valid, 1) == std::vector<std::int64_t>{1, 0, 0});
    CHECK(row(b.targets, 1) == std::vector<std::int64_t>{X, X, X});
  }
  SECTION("uint32 from the extension") {
    std::string path = dir.write("c.u32", little_endian({1, 2, 3}, 4));
    TokenFileSource source(path, 250);
    CHECK(source.width() == 4);
    CHECK(values(source.next(1, 2).targets) == std::vector<std::int64_t>{2, 3});
  }
}

// A non-looping file is used up once no row can hold a target, even when bytes or tokens remain:
// blank lines after the last document, one-token documents at the end. (The old rule, "the cursor
// is on the last byte or token", let a run take one more step with nothing to score.)
TEST_CASE("a non-looping file is used up at its last target, whatever unscorable tail follows", "[data]") {
  TempDir dir;
  SECTION("text ending in blank lines") {
    TextFileSource source(dir.write("blank_tail.txt", "abcde\n\n"), 250, /*loop=*/false);
    CHECK_FALSE(source.used_up());
    const Batch first = source.next(1, 2);  // a, b, c: the cursor on c
    CHECK(first.target_count() == 2);
    CHECK_FALSE(source.used_up());
    const Batch second = source.next(1, 2);  // c, d, e: the cursor on e, only blank lines after it
    CHECK(second.target_count() == 2);
    CHECK(source.used_up());
    CHECK_FALSE(source.exhausted());
    CHECK(source.next(1, 2).target_count() == 0);  // what the old rule let a run train on
  }
  SECTION("text ending in one-byte documents") {
    TextFileSource source(dir.write("short_docs.txt", "abc\n\nx\n\ny"), 250, /*loop=*/false);
    CHECK(source.next(1, 2).target_count() == 2);  // a, b, c
    CHECK(source.used_up());
  }
  SECTION("tokens ending in an eos and a one-token document") {
    TokenFileSource source(dir.write("eos_tail.u16", little_endian({1, 2, 3, 0, 7}, 2)), 250, 2, 0, /*loop=*/false);
    CHECK(source.next(1, 2).target_count() == 2);  // 1, 2, 3: the cursor on 3, whose target is the eos
    CHECK_FALSE(source.used_up());
    CHECK(source.next(1, 1).target_count() == 1);  // 3 -> 0: the cursor on the eos
    CHECK(source.used_up());
  }
  SECTION("a looping file is never used up") {
    TextFileSource source(dir.write("loop_tail.txt", "abcde\n\n"), 250, /*loop=*/true);
    source.next(1, 4);
    CHECK_FALSE(source.used_up());
  }
}

TEST_CASE("data errors name the file and what is wrong", "[data]") {
  TempDir dir;
  std::string odd = dir.write("odd.u16", std::string("\x01\x00\x02", 3));
  std::string msg = error_of([&] { TokenFileSource(odd, 250); });
  CHECK_THAT(msg, Catch::Contains(odd) && Catch::Contains("not a multiple of the token width 2"));

  std::string big = dir.write("big.u16", little_endian({1, 2, 251, 3}, 2));
  msg = error_of([&] { TokenFileSource(big, 250); });
  CHECK_THAT(msg, Catch::Contains(big) && Catch::Contains("token index 2") && Catch::Contains("251"));

  std::string nowidth = dir.write("tokens.bin", little_endian({1, 2}, 2));
  msg = error_of([&] { TokenFileSource(nowidth, 250); });
  CHECK_THAT(msg, Catch::Contains(nowidth) && Catch::Contains(".u16"));

  std::string text = dir.write("bad.txt", "hello\xfb world");
  msg = error_of([&] { TextFileSource(text, 250); });
  CHECK_THAT(msg, Catch::Contains(text) && Catch::Contains("byte offset 5") && Catch::Contains("value 251"));

  std::string blank = dir.write("blank.txt", "\n\n\n");
  CHECK_THAT(error_of([&] { TextFileSource(blank, 250); }), Catch::Contains(blank));

  std::string missing = (dir.path / "missing.txt").string();
  CHECK_THAT(error_of([&] { TextFileSource(missing, 250); }), Catch::Contains(missing));

  // Nothing to train on: no token has a successor in its document (a run would score nothing).
  std::string one = dir.write("one.u16", little_endian({7}, 2));
  CHECK_THAT(error_of([&] { TokenFileSource(one, 250); }),
             Catch::Contains(one) && Catch::Contains("nothing to train on: the file holds one token"));
  std::string eos_only = dir.write("eos.u16", little_endian({3, 3, 3}, 2));
  CHECK_THAT(error_of([&] { TokenFileSource(eos_only, 250, 0, std::int64_t{3}); }),
             Catch::Contains(eos_only) && Catch::Contains("every document is one token long"));
  CHECK_NOTHROW(TokenFileSource(dir.write("pair.u16", little_endian({3, 5, 3}, 2)), 250, 0, std::int64_t{3}));
  std::string singles = dir.write("singles.txt", "a\n\nb\n\n\nc");
  CHECK_THAT(error_of([&] { TextFileSource(singles, 250); }),
             Catch::Contains(singles) && Catch::Contains("every document is one byte long"));
  CHECK_NOTHROW(TextFileSource(dir.write("two.txt", "a\n\nbc"), 250));

  CHECK_THAT(error_of([] { SyntheticSource(1, 3, SyntheticOptions{4, 8, 64}); }),
             Catch::Contains("synthetic_branching"));
}

TEST_CASE("a file source's cursor carries a content hash: an edited file of the same size is refused", "[data]") {
  TempDir dir;
  // The hash is fixed by its definition, not by the machine (values from an independent Python
  // transcription of the algorithm): checkpoints stay resumable across machines and builds.
  CHECK(MappedFile(dir.write("empty.txt", "")).content_hash() == "4ff647e2e4e81014");
  std::string bytes;
  for (int i = 0; i < 200; ++i) bytes += static_cast<char>(i);
  CHECK(MappedFile(dir.write("bytes.bin", bytes)).content_hash() == "f9bed354d3198aec");

  const std::string text_path = dir.write("t.txt", "abc\n\ndef");
  nlohmann::json text_cursor = TextFileSource(text_path, 250).cursor();
  CHECK(text_cursor.at("file_hash") == "3d87db10d5e7323d");
  const std::string token_path = dir.write("t.u16", little_endian({5, 6, 0, 7}, 2));
  const nlohmann::json token_cursor = TokenFileSource(token_path, 250, 0, std::int64_t{0}).cursor();

  // Edited in place, same size: the size check alone would take it.
  dir.write("t.txt", "abd\n\ndef");
  dir.write("t.u16", little_endian({5, 6, 0, 8}, 2));
  TextFileSource text(text_path, 250);
  TokenFileSource tokens(token_path, 250, 0, std::int64_t{0});
  CHECK_THAT(error_of([&] { text.restore(text_cursor); }),
             Catch::Contains(text_path) && Catch::Contains("'file_hash': the checkpoint read a file whose content hash is " +
                                            text_cursor.at("file_hash").get<std::string>() + ", this file's is ") &&
                 Catch::Contains("the file changed since"));
  CHECK_THAT(error_of([&] { tokens.restore(token_cursor); }), Catch::Contains("'file_hash'"));
  // A cursor saved before file_hash existed is checked by size only.
  text_cursor.erase("file_hash");
  text.restore(text_cursor);
  CHECK(text.cursor().at("offset") == text_cursor.at("offset"));
}

TEST_CASE("restore rejects cursors that do not fit, naming the field", "[data]") {
  TempDir dir;
  std::string path = dir.write("t.txt", "abc\n\ndef");
  TextFileSource text(path, 250);
  SyntheticSource synthetic(1, 250);
  CHECK_THAT(error_of([&] { synthetic.restore(text.cursor()); }), Catch::Contains("'source'"));
  nlohmann::json cursor = text.cursor();
  cursor["offset"] = 4;  // the second '\n' of the separator
  CHECK_THAT(error_of([&] { text.restore(cursor); }), Catch::Contains("'offset'") && Catch::Contains(path));
  cursor["offset"] = 100;
  CHECK_THAT(error_of([&] { text.restore(cursor); }), Catch::Contains("'offset'"));
  cursor["offset"] = 5;
  cursor["file_size"] = 9;
  CHECK_THAT(error_of([&] { text.restore(cursor); }), Catch::Contains("'file_size'"));
  nlohmann::json s = synthetic.cursor();
  s.erase("document");
  CHECK_THAT(error_of([&] { synthetic.restore(s); }), Catch::Contains("'document'"));
  s["document"] = "three";
  CHECK_THAT(error_of([&] { synthetic.restore(s); }), Catch::Contains("'document'"));
  // A valid cursor into the middle of the second document: position 1 of "def".
  cursor["file_size"] = 8;
  cursor["offset"] = 6;
  text.restore(cursor);
  CHECK(values(text.next(1, 2).positions) == std::vector<std::int64_t>{1, 2});
}

TEST_CASE("make_data_source builds the configured source", "[data]") {
  TempDir dir;
  DataConfig config;
  auto synthetic = make_data_source(config, 250, 1);
  CHECK(synthetic->entropy_nats_per_token().value() == Approx(1.242453).margin(1e-6));
  config.kind = DataSourceKind::text;
  config.path = dir.write("x.txt", "hello");
  auto text = make_data_source(config, 250, 1);
  CHECK_FALSE(text->entropy_nats_per_token().has_value());
  CHECK_THAT(text->describe(), Catch::Contains(config.path));
  CHECK(values(text->next(1, 4).input_ids) == std::vector<std::int64_t>{'h', 'e', 'l', 'l'});
  config.kind = DataSourceKind::tokens;
  config.path = dir.write("y.u32", little_endian({3, 1, 4}, 4));
  config.eos_id = 1;
  auto tokens = make_data_source(config, 250, 1);
  CHECK(values(tokens->next(1, 3).positions) == std::vector<std::int64_t>{0, 1, 0});
  CHECK(parse_data_source_spec("tokens:/a/b.u16")->path == "/a/b.u16");
  CHECK_FALSE(parse_data_source_spec("text:").has_value());
  CHECK_FALSE(parse_data_source_spec("wiki").has_value());
}

TEST_CASE("make_data_source names the config and the key a data error is about", "[data]") {
  TempDir dir;
  DataConfig config;
  config.kind = DataSourceKind::tokens;
  config.path = dir.write("z.u16", little_endian({3, 1, 4}, 2));
  config.eos_id = 250;  // past the usable vocabulary: an error about data.eos_id, not about the file
  try {
    (void)make_data_source(config, 250, 1, "run.yaml");
    FAIL("data.eos_id 250 was accepted");
  } catch (const DataError& e) {
    CHECK(e.key() == "data.eos_id");
    CHECK(std::string(e.what()) == "run.yaml: " + config.path +
                                       ": data.eos_id: expected an integer in [0, 250) (the usable vocabulary), got 250");
  }
  config.eos_id.reset();
  config.token_width = 4;  // contradicts .u16
  try {
    (void)make_data_source(config, 250, 1, "run.yaml");
    FAIL("data.token_width 4 on a .u16 file was accepted");
  } catch (const DataError& e) {
    CHECK(e.key() == "data.token_width");
    CHECK_THAT(e.what(), Catch::StartsWith("run.yaml: " + config.path + ": data.token_width 4 contradicts"));
  }
  config.token_width = 0;
  config.path = dir.write("empty.u16", "");  // the file itself: the error is about data.source
  try {
    (void)make_data_source(config, 250, 1, "run.yaml");
    FAIL("an empty token file was accepted");
  } catch (const DataError& e) {
    CHECK(e.key().empty());
    CHECK(std::string(e.what()) == "run.yaml: data.source: " + config.path + ": no tokens (the file is empty)");
  }
}

TEST_CASE("read_rows: a process's ranges of a global batch are those rows of it, and every reader ends at one cursor",
          "[data]") {
  // A non-looping document list that runs out inside the second batch (its padding included).
  auto documents = [] {
    return std::make_unique<DocumentListSource>(
        std::vector<std::vector<std::int64_t>>{{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10, 11, 12, 13, 14}, {15, 16, 17}},
        /*loop=*/false);
  };
  auto synthetic = [] { return std::make_unique<SyntheticSource>(5, 250); };
  const std::vector<std::vector<RowRange>> cases = {
      {{0, 8}}, {{0, 2}}, {{2, 4}}, {{6, 8}}, {{0, 2}, {4, 6}}, {{1, 2}, {3, 5}, {7, 8}}};
  for (int kind = 0; kind < 2; ++kind) {
    for (const auto& ranges : cases) {
      INFO((kind == 0 ? "documents" : "synthetic") << ", " << ranges.size() << " range(s) from row "
                                                   << ranges.front().begin);
      std::unique_ptr<DataSource> whole = kind == 0 ? std::unique_ptr<DataSource>(documents())
                                                    : std::unique_ptr<DataSource>(synthetic());
      std::unique_ptr<DataSource> part = kind == 0 ? std::unique_ptr<DataSource>(documents())
                                                   : std::unique_ptr<DataSource>(synthetic());
      for (int step = 0; step < 2; ++step) {
        const Batch all = whole->next(8, 3);
        CHECK(same_batch(Batch::concat_rows({all.slice_rows(0, 3), all.slice_rows(3, 8)}), all));
        std::vector<Batch> expected;
        for (const RowRange& r : ranges) expected.push_back(all.slice_rows(r.begin, r.end));
        CHECK(same_batch(read_rows(*part, 8, 3, ranges), Batch::concat_rows(expected)));
        CHECK(part->cursor() == whole->cursor());
      }
    }
  }
  DocumentListSource source({{1, 2, 3}});
  CHECK_THROWS_AS(read_rows(source, 4, 2, {{2, 3}, {1, 2}}), std::invalid_argument);  // out of order
  CHECK_THROWS_AS(read_rows(source, 4, 2, {{3, 5}}), std::invalid_argument);          // past the batch
}

TEST_CASE("a data file modified in place after opening is refused naming it, one renamed into place is not", "[data]") {
  TempDir dir;
  const std::string path = dir.write("edited.txt", "abcdef\n\nghijkl\n");
  TextFileSource source(path, 250);
  source.check_unchanged();  // as opened
  (void)source.next(1, 4);
  // Replaced by a rename (the way to change data): the mapping keeps the bytes opened.
  const std::string replacement = dir.write("replacement.txt", "ABCDEF\n\nGHIJKL\n");
  std::filesystem::rename(replacement, path);
  source.check_unchanged();
  CHECK(values(source.next(1, 4).input_ids) == std::vector<std::int64_t>{'e', 'f', 'g', 'h'});  // the old bytes
  // Edited in place, same size: refused (its modification time moves; set it ahead to be sure).
  TokenFileSource tokens(dir.write("edited.u16", little_endian({1, 2, 3, 4}, 2)), 250);
  const std::string token_path = dir.path / "edited.u16";
  {
    std::fstream f(token_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2);
    f.put(static_cast<char>(9));
  }
  const timespec later[2] = {{0, UTIME_OMIT}, {std::time(nullptr) + 10, 0}};
  REQUIRE(::utimensat(AT_FDCWD, token_path.c_str(), later, 0) == 0);
  CHECK_THAT(error_of([&] { tokens.check_unchanged(); }),
             Catch::StartsWith(token_path + ": the data file was modified in place while the run read it (8 bytes"));
}

TEST_CASE("a token file truncated while mapped ends the process naming the file, exit 1", "[data]") {
  TempDir dir;
  std::vector<std::uint32_t> ids(8192);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint32_t>(i % 200);
  // A long path (~1,100 bytes) must be named whole.
  fs::path deep;
  for (int i = 0; i < 10; ++i) deep /= std::string(100, static_cast<char>('a' + i));
  fs::create_directories(dir.path / deep);
  const std::string path = dir.write((deep / "shrinks.u16").string(), little_endian(ids, 2));
  REQUIRE(path.size() > 1000);
  int err[2];
  REQUIRE(::pipe(err) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no Catch here: the exit status and stderr say what happened
    ::dup2(err[1], STDERR_FILENO);
    TokenFileSource source(path, 250);
    if (::truncate(path.c_str(), 100) != 0) ::_exit(10);
    (void)source.next(4, 1024);  // past the first page: the lost bytes
    ::_exit(11);                 // read without a fault: not what this test is about
  }
  ::close(err[1]);
  std::string said;
  char buffer[512];
  for (ssize_t n; (n = ::read(err[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<std::size_t>(n));
  ::close(err[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO(said);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK_THAT(said, Catch::Contains("atoll: data file " + path + " could not be read: it was truncated while the run "
                                   "read it") && Catch::EndsWith("(exit 1)\n"));
}

// A cursor restored with its epoch counter at the int64 limit (only a hand edit makes one): the
// next pass over the file is refused by name instead of wrapping to a negative epoch that the run
// would save and its own load refuse.
TEST_CASE("a file source's epoch counter at its limit stops the next pass instead of wrapping", "[data]") {
  TempDir dir;
  const std::string text_path = dir.write("tiny.txt", "abcdef\n\nghij\n");
  std::vector<std::uint32_t> tokens = {1, 2, 3, 0, 4, 5};
  const std::string token_path = dir.write("tiny.u16", little_endian(tokens, 2));
  auto check = [](auto make, const std::string& path) {
    auto source = make();
    nlohmann::json cursor = source->cursor();
    cursor["epoch"] = std::numeric_limits<std::int64_t>::max();
    auto resumed = make();
    resumed->restore(cursor);
    CHECK_THROWS_WITH(resumed->next(4, 16), Catch::Contains(path) && Catch::Contains("epoch counter is at its limit"));
  };
  SECTION("text") { check([&] { return std::make_unique<TextFileSource>(text_path, 250); }, text_path); }
  SECTION("tokens") {
    check([&] { return std::make_unique<TokenFileSource>(token_path, 250, 0, std::int64_t{0}); }, token_path);
  }
}

// A FIFO named as data (or a shell's <(...)) is refused as not a regular file at once: opening it
// for reading would otherwise wait for a writer forever.
TEST_CASE("a FIFO named as a data file is refused, not waited on", "[data]") {
  TempDir dir;
  const std::string fifo = (dir.path / "pipe.u16").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(TokenFileSource(fifo, 250, 0, std::int64_t{0}),
                    Catch::Contains(fifo) && Catch::Contains("not a regular file"));
}
