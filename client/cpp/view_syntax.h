// The view syntax: one way to write a buffer reference with a view, shared by the C++
// client, the CLI and the documentation (README, "Views"). It is NumPy's, for the
// indexing and shape functions a view is made of:
//
//   reference := name suffix*
//   suffix    := '[' item (',' item)* [','] ']'    basic indexing; '[]' takes every axis
//              | '.T'                              reverses the axes
//              | '.transpose(' [axes] ')'          permutes them (none: reverses)
//              | '.reshape(' [extents] ')'         one extent may be -1
//              | '.squeeze(' [axes] ')'            none: every axis of length 1
//              | '.expand_dims(' axes ')'
//              | '.broadcast_to(' extents ')'
//   item      := integer | [integer] ':' [integer] [':' [integer]] | 'None' | '...'
//
// e.g. x[0:10, ::2]  x[-1]  x[..., None]  x.T  x.transpose(1, 0, 2)  x.reshape(2, -1)
// x.squeeze(0)  x.expand_dims(0)  x.broadcast_to(4, 3)  x[0:10, ::2].T
//
// Suffixes chain in any order, each one a ViewStep. The argument lists may also be
// written as one tuple (x.reshape((2, -1))). Spaces are allowed around every token
// after the name (x[0 : 10] . T).
// Integers are decimal with an optional sign.
//
// The name is the id or name of the buffer: everything before the first '[' or the
// first '.' that starts one of the suffixes above (".T" followed by the end, '[', '.' or
// a space; ".reshape(" and the others). A text without a suffix is a plain reference,
// taken as it is.
#ifndef GPUCOMPUTE_CLIENT_CPP_VIEW_SYNTAX_H_
#define GPUCOMPUTE_CLIENT_CPP_VIEW_SYNTAX_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "client/cpp/array_ref.h"

namespace gpucompute {

// Parses `text`; an InvalidArgument status gives the position (counting characters
// from 1) and what was expected there.
absl::StatusOr<ArrayRef> ParseArrayRef(std::string_view text);

// The view syntax of `ref`, which ParseArrayRef reads back as the same reference
// (for names that do not themselves contain a suffix).
std::string FormatArrayRef(const ArrayRef& ref);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_VIEW_SYNTAX_H_
