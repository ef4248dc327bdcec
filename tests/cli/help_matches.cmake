# `posembed help COMMAND` prints exactly what `posembed COMMAND --help` prints,
# for every command `posembed --help` lists, and `posembed help` what
# `posembed --help` prints; all with exit status 0.
#   cmake -DPOSEMBED=path/to/posembed -P help_matches.cmake
function(run_posembed out_var)
  execute_process(COMMAND ${POSEMBED} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
    message(FATAL_ERROR "posembed ${ARGN}: exit status ${rc}, stderr:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

run_posembed(main --help)
run_posembed(help_main help)
if(NOT help_main STREQUAL main OR NOT main MATCHES "Usage: ")
  message(FATAL_ERROR "posembed help:\n${help_main}\ndiffers from posembed --help:\n${main}")
endif()
# The command names: the lines "  NAME   description" after "Subcommands:".
string(REGEX REPLACE ".*\nSubcommands:\n" "" listing "${main}")
string(REGEX MATCHALL "(^|\n)  [a-z][a-z-]*" names "${listing}")
list(TRANSFORM names STRIP)
list(LENGTH names count)
if(count LESS 10)
  message(FATAL_ERROR "found ${count} commands (${names}) in posembed --help:\n${main}")
endif()
foreach(name IN LISTS names)
  run_posembed(dash ${name} --help)
  run_posembed(help help ${name})
  if(NOT help STREQUAL dash OR NOT dash MATCHES "Usage: [^\n]*posembed ${name}")
    message(FATAL_ERROR "posembed help ${name}:\n${help}\ndiffers from posembed ${name} --help:\n${dash}")
  endif()
endforeach()
message("posembed help matches --help for: ${names}")
