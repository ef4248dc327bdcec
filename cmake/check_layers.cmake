# Fails when a source includes a header of a higher layer. The layers, lowest first:
# core <- io <- model <- tools <- cli (the program) and python (the extension); a file may
# include its own layer and those below. Run by the build (CMakeLists.txt) as
#   cmake -DSOURCE_DIR=src -DSTAMP=layers.ok -P check_layers.cmake
set(order core io model tools)
file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/*.h ${SOURCE_DIR}/*.cpp)
set(problems "")
foreach(file IN LISTS files)
  if(file MATCHES "^posembed/([a-z_]+)/")
    list(FIND order ${CMAKE_MATCH_1} own)
  else()
    continue()  # cli/ and python/ sit above every layer
  endif()
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"posembed/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"posembed/([a-z_]+)/" _ "${line}")
    list(FIND order "${CMAKE_MATCH_1}" theirs)
    if(theirs GREATER own)
      list(GET order ${own} own_name)
      string(STRIP "${line}" line)
      string(APPEND problems "  src/${file}: ${line}: ${own_name} may include only "
        "layers below it (order: core <- io <- model <- tools)\n")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "includes that go up the layers:\n${problems}"
    "Move the code down to the layer it needs, or the caller up.")
endif()
file(TOUCH ${STAMP})
