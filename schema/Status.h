//===- Status.h - Success or an error message -------------------*- C++ -*-===//
//
// The schema and the runtime report every problem with user input (files,
// shapes, metadata) as a Status carrying a message, never by asserting,
// aborting or throwing.
// Messages name the file and the tensor or field, are lower-case and have no
// final period, so that a tool can print "tool: error: <message>".
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_STATUS_H
#define DFLASH_SCHEMA_STATUS_H

#include <string>
#include <utility>

namespace dflash {

class [[nodiscard]] Status {
public:
  /// A default-constructed Status is a success.
  Status() = default;

  static Status success() { return Status(); }
  static Status error(std::string message) {
    Status status;
    status.failed = true;
    status.text = std::move(message);
    return status;
  }

  bool ok() const { return !failed; }
  /// The error message; empty on success.
  const std::string &message() const { return text; }

private:
  bool failed = false;
  std::string text;
};

} // namespace dflash

/// Returns the Status of `expr` from the enclosing function when it is an
/// error; the way a failure is passed up unchanged.
#define DFLASH_RETURN_IF_ERROR(expr)                                           \
  do {                                                                         \
    if (::dflash::Status dflashStatus_ = (expr); !dflashStatus_.ok())          \
      return dflashStatus_;                                                    \
  } while (false)

#endif // DFLASH_SCHEMA_STATUS_H
