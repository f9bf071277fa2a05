// The frame every family's `model:` section shares: the preset (an unknown one is a ConfigError),
// the overrides read through a ConfigReader that also knows `family` and `preset` (unknown keys
// are errors), then the family's validate(), whose "model.<field>: <problem>" becomes a
// ConfigError naming the file and that key.
#pragma once
#include <stdexcept>
#include <string>

#include "graph/config.hpp"
#include "graph/config_reader.hpp"

namespace atl {

template <class Config, class Preset, class ReadOverrides>
Config read_family_config(const ModelSection& section, const std::string& file, const std::string& family,
                          const std::string& default_preset, Preset preset, ReadOverrides read_overrides) {
  if (section.family != family) {
    throw ConfigError(file, "model.family", "expected " + family + ", got '" + section.family + "'");
  }
  Config c;
  try {
    c = preset(section.preset.empty() ? default_preset : section.preset);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(file, "model.preset", e.what());
  }
  ConfigReader r(section.overrides, file, "model");
  r.allow("family");
  r.allow("preset");
  read_overrides(r, c);
  r.finish();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    const auto colon = msg.find(": ");
    throw ConfigError(file, msg.substr(0, colon), colon == std::string::npos ? msg : msg.substr(colon + 2));
  }
  return c;
}

}  // namespace atl
