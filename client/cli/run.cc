// gpucompute run FILE: a file of operation commands sent through one session.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cli/cli.h"
#include "client/cpp/session.h"

namespace gpucompute::cli {
namespace {

// One operation of the file, ready to send.
struct FileOperation {
  std::string tag;
  v1::SubmitRequest request;
};

// Splits a line into words: blanks separate them, '...' and "..." group them (a
// backslash escapes the next character inside "..."), and a '#' that starts a word
// starts a comment.
absl::StatusOr<std::vector<std::string>> SplitWords(std::string_view line) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == line.size() || line[i] == '#') break;
    std::string word;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
      const char c = line[i++];
      if (c != '\'' && c != '"') {
        word.push_back(c);
        continue;
      }
      bool closed = false;
      while (i < line.size()) {
        char q = line[i++];
        if (q == c) {
          closed = true;
          break;
        }
        if (c == '"' && q == '\\' && i < line.size()) q = line[i++];
        word.push_back(q);
      }
      if (!closed) return absl::InvalidArgumentError(absl::StrCat("unclosed ", std::string(1, c)));
    }
    words.push_back(std::move(word));
  }
  return words;
}

// Parses one line; nullopt for a blank or comment line.
absl::StatusOr<std::optional<FileOperation>> ParseLine(std::string_view line, int number,
                                                       const GlobalOptions& options) {
  absl::StatusOr<std::vector<std::string>> words = SplitWords(line);
  if (!words.ok()) return words.status();
  if (words->empty()) return std::nullopt;
  FileOperation op;
  size_t next = 0;
  if ((*words)[0].size() > 1 && (*words)[0][0] == '@') {
    op.tag = (*words)[0].substr(1);
    ++next;
  } else {
    op.tag = absl::StrCat(number);
  }
  if (next == words->size()) return absl::InvalidArgumentError("a tag without an operation");
  const Command* command = FindCommand((*words)[next]);
  if (command == nullptr || command->build == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", (*words)[next], "' is not an operation command (eval gemv reduce rand)"));
  }
  const std::span<const std::string> rest(words->data() + next + 1, words->size() - next - 1);
  absl::StatusOr<ParsedArgs> args = ParsedArgs::Parse(rest, command->flags);
  if (!args.ok()) return args.status();
  if (args->help()) return absl::InvalidArgumentError("--help has no place in a file");
  if (Outcome built = command->build(*args, &op.request); built.exit_code != kExitOk) {
    return absl::InvalidArgumentError(built.message);
  }
  op.request.set_stream_id(options.stream);
  return op;
}

absl::StatusOr<std::vector<FileOperation>> ParseFile(std::istream& in, std::string_view path,
                                                     const GlobalOptions& options) {
  std::vector<FileOperation> ops;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::StatusOr<std::optional<FileOperation>> op = ParseLine(line, number, options);
    if (!op.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToAbsl(path), ":", number, ": ", op.status().message()));
    }
    if (op->has_value()) ops.push_back(**std::move(op));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", ToAbsl(path)));
  return ops;
}

}  // namespace

Outcome RunFile(CliContext& context, const ParsedArgs& args) {
  if (args.positional().size() != 1) return Outcome::Usage("give one FILE (or - for stdin)");
  const std::string& path = args.positional()[0];
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) return Outcome::Local("run", absl::NotFoundError(absl::StrCat("cannot open ", path)));
  }
  absl::StatusOr<std::vector<FileOperation>> ops =
      ParseFile(path == "-" ? std::cin : file, path, context.options());
  if (!ops.ok()) {
    if (ops.status().code() == absl::StatusCode::kDataLoss) return Outcome::Local("run", ops.status());
    return Outcome{kExitUsage, std::string(ops.status().message()), false};
  }
  absl::StatusOr<Client*> client = context.client();
  if (!client.ok()) return Outcome::Server("run", client.status());

  absl::Mutex mu;
  std::optional<Outcome> first_failure;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(
      **client, [&](const std::string& tag, const v1::Operation& operation) {
        absl::MutexLock lock(&mu);
        context.Print(context.json() ? absl::StrCat("{\"tag\":", JsonString(tag),
                                                    ",\"operation\":", ToJson(operation), "}")
                                     : absl::StrCat(tag, "  ", FormatOperation(operation)));
        if (operation.state() == v1::Operation::STATE_FAILED && !first_failure.has_value()) {
          first_failure = Outcome::Server(
              absl::StrCat("run: ", tag),
              absl::Status(static_cast<absl::StatusCode>(operation.error_code()),
                           operation.error_message()));
        }
      });
  if (!session.ok()) return Outcome::Server("run", session.status());
  for (FileOperation& op : *ops) (*session)->Submit(std::move(op.request), op.tag);
  absl::Status closed = (*session)->Close();
  if (!closed.ok()) return Outcome::Server("run", closed);
  absl::MutexLock lock(&mu);
  return first_failure.value_or(Outcome::Ok());
}

}  // namespace gpucompute::cli
