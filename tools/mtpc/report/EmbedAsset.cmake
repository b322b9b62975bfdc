# Writes a C++ header that holds a text file as a raw string literal, so the
# report's stylesheet and script live in real .css/.js files and still end up
# inside the mtpc binary (the page is one self-contained file, no network).
#
#   cmake -DINPUT=report.css -DSYMBOL=kReportCss -DOUTPUT=ReportCss.inc \
#         -P EmbedAsset.cmake
#
# The header declares `static constexpr char SYMBOL[]` with the file's bytes,
# unchanged (no newline added or removed). A file containing the literal's
# closing delimiter is refused rather than cut short.
foreach(var INPUT SYMBOL OUTPUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "EmbedAsset.cmake: -D${var}=... is required")
  endif()
endforeach()

set(delimiter "mtpc_asset")
file(READ "${INPUT}" content)
string(FIND "${content}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT}: contains ')${delimiter}\"', the raw string's "
                      "closing delimiter; change the delimiter in ${CMAKE_CURRENT_LIST_FILE}")
endif()

get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}"
  "// Generated from ${name} by EmbedAsset.cmake: edit ${name}, not this file.\n"
  "static constexpr char ${SYMBOL}[] = R\"${delimiter}(${content})${delimiter}\";\n")
