// The flag parser of the gpucompute CLI: the global flags and each command's flags,
// read by CLI11. CLI11 matches flags to their values, collects the positionals in
// order and reports a missing value; this file turns its answer into ParsedArgs and
// its errors into the CLI's usage messages, and keeps the CLI's own conventions
// where CLI11's differ (see SplitInlineValues and Classify).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"

namespace gpucompute::cli {
namespace {

constexpr FlagSpec ValueFlag(std::string_view name) { return FlagSpec{name, "", true}; }
constexpr FlagSpec SwitchFlag(std::string_view name) { return FlagSpec{name, "", false}; }

// The flags before the command (MainHelp in main.cc describes them).
constexpr FlagSpec kGlobalFlags[] = {
    ValueFlag("--server"),          ValueFlag("--client"),     ValueFlag("--request-id"),
    SwitchFlag("--json"),           ValueFlag("--stream"),     ValueFlag("--timeout"),
    ValueFlag("--token"),           ValueFlag("--token-file"), SwitchFlag("--tls"),
    ValueFlag("--tls-ca"),          ValueFlag("--tls-cert"),   ValueFlag("--tls-key"),
    ValueFlag("--tls-server-name"), ValueFlag("--tenant"),
};

const FlagSpec* FindFlag(std::span<const FlagSpec> flags, std::string_view name) {
  const auto spec = std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& f) {
    return f.name == name || (!f.alias.empty() && f.alias == name);
  });
  return spec == flags.end() ? nullptr : &*spec;
}

// Whether `arg` is a flag of the CLI's: "--" and a letter, or for the global flags
// anything that starts with '-'. So a command's positionals may be expressions and
// numbers such as "-x*2" or "-1", which CLI11 would take for short flags.
bool LooksLikeFlag(std::string_view arg, bool global) {
  if (global) return arg.size() > 1 && arg[0] == '-';
  return arg.size() > 2 && arg[0] == '-' && arg[1] == '-' &&
         absl::ascii_isalpha(static_cast<unsigned char>(arg[2]));
}

// CLI11 reads "--flag=" as a flag whose value is the next argument, "-o=FILE" as the
// value "=FILE" and "--switch=true" as the switch; the CLI has always read them as the
// empty value, FILE and a mistake. Split into "--flag" "" and "-o" "FILE", the values
// mean that to CLI11 too; a switch with a value is refused here. Only declared flags
// are looked at, and only among the flags: a command's up to "--", the global ones up
// to the command.
absl::StatusOr<std::vector<std::string>> SplitInlineValues(std::span<const std::string> args,
                                                           std::span<const FlagSpec> flags,
                                                           bool global) {
  std::vector<std::string> out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || (global && !LooksLikeFlag(arg, global))) break;
    const size_t equals = arg.find('=');
    const FlagSpec* spec = FindFlag(flags, std::string_view(arg).substr(0, equals));
    if (spec == nullptr || !spec->takes_value) {
      if (spec != nullptr && equals != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(ToAbsl(spec->name), " takes no value"));
      }
      out.push_back(arg);
      continue;
    }
    out.push_back(arg.substr(0, equals));
    if (equals != std::string::npos) {
      out.push_back(arg.substr(equals + 1));
    } else if (i + 1 < args.size()) {
      out.push_back(args[++i]);  // the value, whatever it looks like
    }
  }
  out.insert(out.end(), args.begin() + i, args.end());
  return out;
}

// CLI11's error as the CLI words it. Its messages start with the flag's name.
std::string UsageMessage(const CLI::ParseError& error) {
  const std::string what = error.what();
  const std::string flag = what.substr(0, what.find_first_of(": "));
  if (absl::StrContains(what, " required ") && absl::EndsWith(what, " missing")) {
    return absl::StrCat(flag, " needs a value");
  }
  return what;
}

// The value of `flag` read by `parse`, nullopt when the flag is absent; an error says
// the flag needs `what`.
template <typename T, typename Parse>
absl::StatusOr<std::optional<T>> TypedValue(std::string_view flag,
                                            const std::optional<std::string>& text,
                                            std::string_view what, Parse parse) {
  if (!text.has_value()) return std::optional<T>();
  T value;
  if (!parse(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(flag), " needs ", ToAbsl(what), ", not '", *text, "'"));
  }
  return std::optional<T>(value);
}

}  // namespace

absl::StatusOr<ParsedArgs> ParsedArgs::Parse(std::span<const std::string> args,
                                             std::span<const FlagSpec> flags) {
  return ParseWith(args, flags, /*global=*/false);
}

absl::StatusOr<ParsedArgs> ParsedArgs::ParseGlobal(std::span<const std::string> args) {
  return ParseWith(args, kGlobalFlags, /*global=*/true);
}

absl::StatusOr<ParsedArgs> ParsedArgs::ParseWith(std::span<const std::string> args,
                                                 std::span<const FlagSpec> flags, bool global) {
  CLI::App app;
  // "--help" and "-h" are a switch like the others: the CLI prints its own help.
  app.set_help_flag();
  CLI::Option* help = app.add_flag("--help,-h");
  // What CLI11 does not know comes back in order: positionals, unknown flags, "--" and
  // what follows it. The global flags end at the command, which starts the rest.
  if (global) {
    app.prefix_command();
  } else {
    app.allow_extras();
  }
  std::vector<std::pair<const FlagSpec*, CLI::Option*>> options;
  for (const FlagSpec& spec : flags) {
    std::string names(spec.name);
    if (!spec.alias.empty()) absl::StrAppend(&names, ",", ToAbsl(spec.alias));
    CLI::Option* option = spec.takes_value ? app.add_option(names) : app.add_flag(names);
    // Every value is kept, so that a flag given twice is reported below rather than
    // one value lost.
    if (spec.takes_value) option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    options.emplace_back(&spec, option);
  }

  absl::StatusOr<std::vector<std::string>> split = SplitInlineValues(args, flags, global);
  if (!split.ok()) return split.status();
  std::vector<std::string> reversed = *std::move(split);
  std::reverse(reversed.begin(), reversed.end());  // CLI11 takes them from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(UsageMessage(error));
  }

  ParsedArgs parsed;
  parsed.help_ = help->count() > 0;
  bool flags_ended = false;
  for (std::string& arg : app.remaining()) {
    if (!flags_ended && !global && arg == "--") {
      flags_ended = true;
      continue;
    }
    // The global flags end at the command: what comes first is either an unknown
    // global flag or the command.
    const bool at_command = global && !parsed.positional_.empty();
    if (!flags_ended && !at_command && LooksLikeFlag(arg, global)) {
      const std::string name = arg.substr(0, arg.find('='));
      if (global) return absl::InvalidArgumentError(absl::StrCat("unknown global flag ", name));
      if (FindFlag(kGlobalFlags, name) != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("the global flag ", name, " goes before the command"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    parsed.positional_.push_back(std::move(arg));
  }
  for (const auto& [spec, option] : options) {
    if (option->count() == 0) continue;
    const std::string name(spec->name);
    // A global flag given again takes the later value (a wrapper may set one that its
    // caller overrides); a command's flag given twice is a mistake.
    if (option->count() > 1 && !global) {
      return absl::InvalidArgumentError(name + " is given twice");
    }
    parsed.flags_.emplace_back(name, spec->takes_value ? option->results().back() : "");
  }
  return parsed;
}

bool ParsedArgs::Has(std::string_view flag) const {
  return std::any_of(flags_.begin(), flags_.end(),
                     [&](const auto& entry) { return entry.first == flag; });
}

std::optional<std::string> ParsedArgs::Value(std::string_view flag) const {
  for (const auto& [name, value] : flags_) {
    if (name == flag) return value;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<double>> ParsedArgs::Double(std::string_view flag) const {
  return TypedValue<double>(flag, Value(flag), "a number", [](const std::string& text, double* v) {
    return absl::SimpleAtod(text, v);
  });
}

absl::StatusOr<std::optional<int64_t>> ParsedArgs::Int(std::string_view flag) const {
  return TypedValue<int64_t>(
      flag, Value(flag), "an integer",
      [](const std::string& text, int64_t* v) { return absl::SimpleAtoi(text, v); });
}

absl::StatusOr<std::optional<uint64_t>> ParsedArgs::Uint(std::string_view flag) const {
  return TypedValue<uint64_t>(
      flag, Value(flag), "a non-negative integer", [](const std::string& text, uint64_t* v) {
        // SimpleAtoi would wrap "-1" into a huge unsigned value.
        return text.find('-') == std::string::npos && absl::SimpleAtoi(text, v);
      });
}

}  // namespace gpucompute::cli
