# Writes OUTPUT: the text of INPUT as a C++ raw string literal, for NVRTC sources kept as
# files of their own (kernels/cuda/elementwise/source.cc includes the result). The file's
# leading comment, and the one blank line after it, are left out: they document the file
# for its readers, and keeping them out of the generated kernels means that editing them
# changes no kernel's source, so the kernels cached on disk under its digest stay valid.
#   cmake -DINPUT=<file> -DOUTPUT=<file> -P embed.cmake
file(READ "${INPUT}" text)
while(text MATCHES "^//")
  string(FIND "${text}" "\n" end)
  if(end EQUAL -1)
    set(text "")
  else()
    math(EXPR end "${end} + 1")
    string(SUBSTRING "${text}" ${end} -1 text)
  endif()
endwhile()
if(text MATCHES "^\n")
  string(SUBSTRING "${text}" 1 -1 text)
endif()
# At most 16 characters, the limit of a raw string delimiter.
set(delimiter "gpucompute_cuh")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's end, )${delimiter}\"")
endif()
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}"
     "// Generated from ${name} by kernels/cuda/elementwise/embed.cmake; do not edit.\n"
     "R\"${delimiter}(${text})${delimiter}\"\n")
