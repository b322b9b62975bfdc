# cmake -DOBJECTS=<objects> -DNM=<nm> -DSTAMP=<file> -P CheckGlooObject.cmake
#
# Fails when an object defines a symbol of gloo's: a function or variable in
# namespace gloo, a vtable, VTT or typeinfo of a gloo class, or anything of
# c10d::ProcessGroupGloo::GlooStore (whose base is gloo's). The objects are
# compiled against declarations of gloo's interface (src/gloo-abi), and only
# libtorch's definitions may exist. Undefined references, and std templates
# over pointers to gloo types, are fine. Writes STAMP when all are clean.
foreach(obj IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${obj}
    OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${syms}")
  set(bad "")
  foreach(line IN LISTS lines)
    # "<address> <type> <name>"
    if(line MATCHES "^[0-9a-fA-F]* [A-Za-z] (.*)$")
      set(name "${CMAKE_MATCH_1}")
      if(name MATCHES "^gloo::" OR name MATCHES " for gloo::"
         OR name MATCHES "ProcessGroupGloo::GlooStore")
        string(APPEND bad "\n  ${name}")
      endif()
    endif()
  endforeach()
  if(bad)
    message(FATAL_ERROR "${obj} defines gloo symbols that only libtorch may "
      "define (see runtime/src/gloo-abi/README.md):${bad}")
  endif()
endforeach()
file(WRITE ${STAMP} "ok\n")
